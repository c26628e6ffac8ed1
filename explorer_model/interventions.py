"""What-if experiments: change one part of the model for one run and compare with the unchanged run.
(Longer than ~400 lines on purpose: the whole catalogue of forms in one file, each class holding its string form,
its check and its hooks next to the parser that reads every form back.)

Every intervention is a small frozen value with a canonical string form, used in URLs and on the command line:

    ablate:blocks.3.attn.head5        zero one head's output z (ablate:blocks.3.attn.head2+5 a set;
    ablate-mean:blocks.3.attn.head5   ablate:blocks.3.attn every head); -mean: z := its mean over positions
    skip:blocks.3.attn, skip:blocks.3.mlp   the sub-layer's output (attn_out / mlp_out) set to zero
    no-mask[:blocks.3]                no causal mask (all layers, or one): every position reads the future too
    no-rope[:blocks.3]                Q and K are not rotated (rot_q := q, rot_k := k): no position signal
    norm-identity:blocks.3.ln1        no normalization, gamma kept: the norm outputs x * gamma (scale := 1)
    norm-eps:blocks.3.ln2=0.01        the norm's epsilon replaced
    scale:blocks.3.hook_attn_out=0.5  a hooked tensor (typically a residual branch) multiplied by a factor
    gate-off[:blocks.3]               SwiGLU gate fixed at 1 (hook_act := 1, so post = up)
    relu[:blocks.3]                   SiLU replaced by ReLU (hook_act := relu(hook_pre))
    patch:blocks.5.hook_resid_pre@4   activation patching: position 4 of that tensor taken from a source prompt
                                      (negative positions count from the end of each prompt)

    with intervene(model, [parse("no-mask"), "ablate:blocks.3.attn.head5"], source_tokens=None):
        logits = model(tokens)                       # hooks are removed on exit, whatever happens

Every intervention is a set of HookPoint functions (hooks.py): nothing in the model is modified, so another
thread using the same model (another visitor of the app) is unaffected. Functions that only read a value (for
no-rope, relu, no-mask) run after all functions that replace values on the same hook point, so they see what
the model really uses.
"""
from __future__ import annotations

import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F

from .model import LlamaModel, causal_scores
from .refusal import Refusal

FORMS = ("ablate:blocks.L.attn[.headH[+H…]], ablate-mean:…, skip:blocks.L.attn|mlp, no-mask[:blocks.L], "
         "no-rope[:blocks.L], norm-identity:NORM, norm-eps:NORM=EPS (NORM: blocks.L.ln1|ln2, ln_final), "
         "scale:HOOK=FACTOR, gate-off[:blocks.L], relu[:blocks.L], patch:HOOK@POS")
_READ, _REPLACE = 1, 0  # hook order on one hook point: replacements first, readers last
# What SpecError says, by case (explorer_model/refusal.py: the app's catalogs say it as "interventions.<case>")
REFUSALS = {
    "layer": "layer {layer} does not exist: the model has layers 0…{last}",
    "hook": "no hook point named {name!r} (see docs/hooks.md)",
    "head": "head {head} does not exist: the model has heads 0…{last}",
    "no_final_norm": "this model has no final norm (Post-Norm)",
    "no_gate": "this model's FFN has no gate (it is a ReLU FFN)",
    "patch_target": "patch a tensor with positions first ([batch, pos, …]), not attention scores or patterns",
    "position": "position {pos} does not exist in a prompt of length {n}",
    "source_position": "position {pos} does not exist in the patch's source prompt of length {n}",
    "no_source": "patching needs a source prompt (source_tokens)",
    "not_a_number": "{spec!r}: {text!r} is not a number",
    "not_finite": "{spec!r}: the number must be finite",
    "negative_eps": "{spec!r}: epsilon must be >= 0",
    "unknown": "unknown intervention {spec!r}; the forms are: {forms}",
    "unreadable": "cannot read {spec!r} as a “{kind}” intervention; the forms are: {forms}",
}


class SpecError(Refusal):
    """A change that does not parse or does not fit the model."""
    PREFIX, MESSAGES = "interventions", REFUSALS


def fmt_number(v: float) -> str:
    s = repr(float(v))
    return s[:-2] if s.endswith(".0") else s


def _where(layer: int | None) -> str:
    return "" if layer is None else f":blocks.{layer}"


class Intervention:
    """Base class. Subclasses are frozen dataclasses; str(iv) is the canonical form parse() reads back."""

    alters_attention = False  # replaces attention scores (a recording must then store them, not rebuild them)

    def check(self, model: LlamaModel) -> None:
        """Raise SpecError if this intervention does not fit the model."""

    def hooks(self, model: LlamaModel, source: dict[str, torch.Tensor]) -> list[tuple[str, object, int]]:
        return []  # (hook name, fn, _READ or _REPLACE)

    def source_names(self) -> list[str]:
        return []  # hooks whose values the source prompt must provide


def _check_layer(model: LlamaModel, layer: int | None) -> None:
    if layer is not None and not 0 <= layer < model.cfg.n_layers:
        raise SpecError("layer", layer=layer, last=model.cfg.n_layers - 1)


def _check_hook(model: LlamaModel, name: str) -> None:
    if name not in model.hook_dict:
        block = re.match(r"blocks\.(\d+)\.", name)  # a layer the model lacks: say which it has
        _check_layer(model, int(block.group(1)) if block else None)
        raise SpecError("hook", name=name)


@dataclass(frozen=True)
class _AnyLayer(Intervention):
    """A change of every layer (layer None, the form without ":blocks.L") or of one layer."""
    layer: int | None = None
    kind = ""  # the form's name

    def __str__(self) -> str:
        return self.kind + _where(self.layer)

    def check(self, model):
        _check_layer(model, self.layer)

    def each_layer(self, model: LlamaModel) -> range:
        return range(model.cfg.n_layers) if self.layer is None else range(self.layer, self.layer + 1)


@dataclass(frozen=True)
class AblateHeads(Intervention):
    layer: int
    heads: tuple[int, ...] | None = None  # None: every head of the layer
    mean: bool = False  # mean over positions instead of zero

    def __post_init__(self):
        if self.heads is not None:
            object.__setattr__(self, "heads", tuple(sorted(set(int(h) for h in self.heads))))

    def __str__(self) -> str:
        heads = "" if self.heads is None else ".head" + "+".join(map(str, self.heads))
        return f"{'ablate-mean' if self.mean else 'ablate'}:blocks.{self.layer}.attn{heads}"

    def check(self, model):
        _check_layer(model, self.layer)
        bad = [h for h in self.heads or () if not 0 <= h < model.cfg.n_heads]
        if bad:
            raise SpecError("head", head=bad[0], last=model.cfg.n_heads - 1)

    def hooks(self, model, source):
        heads = list(self.heads) if self.heads is not None else slice(None)

        def fn(z, hp):  # z [batch, pos, head, d_head]
            z = z.clone()
            z[:, :, heads] = z[:, :, heads].mean(1, keepdim=True) if self.mean else 0.0
            return z
        return [(f"blocks.{self.layer}.attn.hook_z", fn, _REPLACE)]


@dataclass(frozen=True)
class Skip(Intervention):
    layer: int
    part: str  # "attn" | "mlp"

    def __str__(self) -> str:
        return f"skip:blocks.{self.layer}.{self.part}"

    def check(self, model):
        _check_layer(model, self.layer)

    def hooks(self, model, source):
        return [(f"blocks.{self.layer}.hook_{self.part}_out", lambda x, hp: torch.zeros_like(x), _REPLACE)]


@dataclass(frozen=True)
class NoMask(_AnyLayer):
    kind = "no-mask"
    alters_attention = True

    def hooks(self, model, source):
        out = []
        for layer in self.each_layer(model):
            seen: dict[str, torch.Tensor] = {}
            a = f"blocks.{layer}.attn."

            def read(key, seen=seen):
                def fn(x, hp):
                    seen[key] = x
                return fn

            def unmasked(scores, hp, seen=seen):
                # The model's own score function with the mask pushed past the last key: nothing is masked.
                if seen["k"].shape[1] != scores.shape[-1]:
                    raise ValueError("no-mask works on whole prompts, not with a KV cache")
                return causal_scores(seen["q"], seen["k"], q_offset=scores.shape[-1])
            out += [(a + "hook_rot_q", read("q"), _READ), (a + "hook_rot_k", read("k"), _READ),
                    (a + "hook_attn_scores", unmasked, _REPLACE)]
        return out


@dataclass(frozen=True)
class NoRope(_AnyLayer):
    kind = "no-rope"

    def hooks(self, model, source):
        out = []
        for layer in self.each_layer(model):
            seen: dict[str, torch.Tensor] = {}
            for key in ("q", "k"):
                a = f"blocks.{layer}.attn.hook_"
                out += [(a + key, lambda x, hp, key=key, seen=seen: seen.__setitem__(key, x), _READ),
                        (a + "rot_" + key, lambda x, hp, key=key, seen=seen: seen[key], _REPLACE)]
        return out


_NORM = r"(blocks\.\d+\.ln[12]|ln_final)"


def _norm_module(model: LlamaModel, target: str):
    if target == "ln_final":
        if model.ln_final is None:
            raise SpecError("no_final_norm")
        return model.ln_final
    layer = int(target.split(".")[1])
    _check_layer(model, layer)
    return getattr(model.blocks[layer], target.split(".")[2])


@dataclass(frozen=True)
class NormIdentity(Intervention):
    """No normalization, gamma kept: RMSNorm(x) = x * gamma (the divisor hook_scale is fixed at 1)."""
    target: str  # "blocks.L.ln1" | "blocks.L.ln2" | "ln_final"

    def __str__(self) -> str:
        return f"norm-identity:{self.target}"

    def check(self, model):
        _norm_module(model, self.target)

    def hooks(self, model, source):
        return [(f"{self.target}.hook_scale", lambda x, hp: torch.ones_like(x), _REPLACE)]


@dataclass(frozen=True)
class NormEps(Intervention):
    target: str
    eps: float

    def __str__(self) -> str:
        return f"norm-eps:{self.target}={fmt_number(self.eps)}"

    def check(self, model):
        _norm_module(model, self.target)

    def hooks(self, model, source):
        # The divisor is sqrt(m + eps) with m = mean(x^2) (LayerNorm: the variance), so m = scale^2 - eps;
        # float64 keeps the round trip exact to float32 precision.
        old = _norm_module(model, self.target).eps

        def fn(scale, hp):
            m = (scale.double().square() - old).clamp_min(0.0)
            return (m + self.eps).sqrt().to(scale.dtype)
        return [(f"{self.target}.hook_scale", fn, _REPLACE)]


@dataclass(frozen=True)
class Scale(Intervention):
    hook: str
    factor: float

    def __str__(self) -> str:
        return f"scale:{self.hook}={fmt_number(self.factor)}"

    @property
    def alters_attention(self) -> bool:  # scaled scores or weights are not what Q and K give: stored, not rebuilt
        return self.hook.endswith(("attn.hook_attn_scores", "attn.hook_pattern"))

    def check(self, model):
        _check_hook(model, self.hook)

    def hooks(self, model, source):
        # the mask's -inf stays: 0 × -inf would be NaN, a negative factor would open the future
        return [(self.hook, lambda x, hp: torch.where(torch.isinf(x), x, x * self.factor), _REPLACE)]


def _check_gated(model: LlamaModel, layer: int | None) -> None:
    _check_layer(model, layer)
    if model.cfg.ffn_type != "swiglu":
        raise SpecError("no_gate")


@dataclass(frozen=True)
class GateOff(_AnyLayer):
    kind = "gate-off"

    def check(self, model):
        _check_gated(model, self.layer)

    def hooks(self, model, source):
        return [(f"blocks.{l}.mlp.hook_act", lambda x, hp: torch.ones_like(x), _REPLACE)
                for l in self.each_layer(model)]


@dataclass(frozen=True)
class Relu(_AnyLayer):
    kind = "relu"

    def check(self, model):
        _check_gated(model, self.layer)

    def hooks(self, model, source):
        out = []
        for layer in self.each_layer(model):
            seen: dict[str, torch.Tensor] = {}
            out += [(f"blocks.{layer}.mlp.hook_pre", lambda x, hp, seen=seen: seen.__setitem__("pre", x), _READ),
                    (f"blocks.{layer}.mlp.hook_act", lambda x, hp, seen=seen: F.relu(seen["pre"]), _REPLACE)]
        return out


@dataclass(frozen=True)
class Patch(Intervention):
    """Position `pos` of hook `hook` takes the value the same hook had at that position on the source prompt."""
    hook: str
    pos: int

    def __str__(self) -> str:
        return f"patch:{self.hook}@{self.pos}"

    def check(self, model):
        _check_hook(model, self.hook)
        if self.hook.endswith(("hook_attn_scores", "hook_pattern")):
            raise SpecError("patch_target")

    def source_names(self):
        return [self.hook]

    def hooks(self, model, source):
        src = source[self.hook]

        def fn(x, hp):
            p_src = absolute_position(self.pos, src.shape[1], "source_position")
            p_dst = absolute_position(self.pos, x.shape[1])
            x = x.clone()
            x[:, p_dst] = src[:, p_src].to(x.dtype)
            return x
        return [(self.hook, fn, _REPLACE)]


def absolute_position(pos: int, n: int, case: str = "position") -> int:
    """`pos` (negative: from the end) as an index into a prompt of n tokens; SpecError(case) where it has none."""
    p = pos + n if pos < 0 else pos
    if not 0 <= p < n:
        raise SpecError(case, pos=pos, n=n)
    return p


# --------------------------------------------------------------------------- parsing
def _float(text: str, spec: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise SpecError("not_a_number", spec=spec, text=text) from None
    if not math.isfinite(v):
        raise SpecError("not_finite", spec=spec)
    return v


_OPTIONAL_LAYER = {cls.kind: cls for cls in (NoMask, NoRope, GateOff, Relu)}


def parse(spec: "str | Intervention") -> Intervention:
    """The intervention a string form names; SpecError with the accepted forms if it names none."""
    if isinstance(spec, Intervention):
        return spec
    s = str(spec).strip()
    kind, _, rest = s.partition(":")
    m = None
    if kind in ("ablate", "ablate-mean"):
        m = re.fullmatch(r"blocks\.(\d+)\.attn(?:\.head(\d+(?:\+\d+)*))?", rest)
        if m:
            heads = None if m.group(2) is None else tuple(int(h) for h in m.group(2).split("+"))
            return AblateHeads(int(m.group(1)), heads, kind == "ablate-mean")
    elif kind == "skip":
        m = re.fullmatch(r"blocks\.(\d+)\.(attn|mlp)", rest)
        if m:
            return Skip(int(m.group(1)), m.group(2))
    elif kind in _OPTIONAL_LAYER:
        m = re.fullmatch(r"(?:blocks\.(\d+))?", rest)
        if m:
            return _OPTIONAL_LAYER[kind](None if m.group(1) is None else int(m.group(1)))
    elif kind == "norm-identity":
        m = re.fullmatch(_NORM, rest)
        if m:
            return NormIdentity(m.group(1))
    elif kind == "norm-eps":
        m = re.fullmatch(_NORM + r"=(.+)", rest)
        if m:
            eps = _float(m.group(2), s)
            if eps < 0:
                raise SpecError("negative_eps", spec=s)
            return NormEps(m.group(1), eps)
    elif kind == "scale":
        m = re.fullmatch(r"([A-Za-z_][\w.]*)=(.+)", rest)
        if m:
            return Scale(m.group(1), _float(m.group(2), s))
    elif kind == "patch":
        m = re.fullmatch(r"([A-Za-z_][\w.]*)@(-?\d+)", rest)
        if m:
            return Patch(m.group(1), int(m.group(2)))
    else:
        raise SpecError("unknown", spec=s, forms=FORMS)
    raise SpecError("unreadable", spec=s, kind=kind, forms=FORMS)


# More changes than any model has heads (Llama-2-70B: 80 layers × 64) are no experiment; the gateway bounds a list
# by its model's own layers × heads
MAX_LIST = 8192


class TooMany(ValueError):
    """A list with more distinct changes than `limit`."""

    def __init__(self, count: int, limit: int):
        self.count, self.limit = count, limit
        super().__init__(f"{count} interventions are more than the {limit} a what-if takes (one per head)")


def parse_list(text: str | Iterable, limit: int = MAX_LIST) -> list[Intervention]:
    """A comma-separated list (the URL form) or an iterable of forms; blanks are ignored. Repeats of a change that
    does the same once or twice (all but scale, whose factors multiply) are kept once, in their first place;
    TooMany when more than `limit` remain (counted while reading: a huge list is not parsed to the end)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: dict = {}
    count = 0
    for x in items:
        if isinstance(x, str) and not x.strip():
            continue
        iv = parse(x)
        key = (len(out), iv) if isinstance(iv, Scale) else iv
        if key not in out:
            out[key] = iv
            count += 1
            if count > limit:
                raise TooMany(sum(1 for y in items if not (isinstance(y, str) and not y.strip())), limit)
    return list(out.values())


def format_list(interventions: Iterable[Intervention]) -> str:
    return ",".join(str(parse(iv)) for iv in interventions)


def needs_source(interventions: Iterable) -> bool:
    return any(parse(iv).source_names() for iv in interventions)


# --------------------------------------------------------------------------- applying
@dataclass
class Active:
    interventions: list[Intervention]
    hook_names: list[str]

    @property
    def alters_attention(self) -> bool:
        return any(iv.alters_attention for iv in self.interventions)


@torch.no_grad()
def source_values(model: LlamaModel, names: Iterable[str], source_tokens) -> dict[str, torch.Tensor]:
    """The unchanged model's values of `names` on the source prompt (for patching)."""
    names = sorted(set(names))
    if not names:
        return {}
    if source_tokens is None:
        raise SpecError("no_source")
    tokens = torch.as_tensor(source_tokens, dtype=torch.long)
    tokens = tokens[None] if tokens.dim() == 1 else tokens
    values: dict[str, torch.Tensor] = {}
    with model.hooks([(n, lambda x, hp: values.__setitem__(hp.name, x.detach())) for n in names]):
        model(tokens)
    return values


@contextmanager
def intervene(model: LlamaModel, interventions: Iterable, source_tokens=None) -> Iterator[Active]:
    """Apply the interventions (objects or string forms) for the duration of the block."""
    ivs = [parse(iv) for iv in interventions]
    for iv in ivs:
        iv.check(model)
    source = source_values(model, [n for iv in ivs for n in iv.source_names()], source_tokens)
    triples = [h for iv in ivs for h in iv.hooks(model, source)]
    triples.sort(key=lambda h: h[2])  # stable: readers after every replacement, list order otherwise kept
    with model.hooks([(name, fn) for name, fn, _ in triples]):
        yield Active(ivs, sorted({name for name, _, _ in triples}))
