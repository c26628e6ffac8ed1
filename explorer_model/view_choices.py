"""The views' own choices: every widget of a view whose value changes what the view shows (a radio, a slider, a box,
a button that unfolds a result), the values it takes and its default. One table for the link (app/url_state.py
reads and writes each as the query parameter of its name), for lecture steps (explorer_model/lecture.py checks a
step's [step.choices] against it) and for "add this view as a step". Pure: no Streamlit, no torch.

A value comes in two forms: native (the widget's value, a lecture file's TOML value) and text (the link's).
`from_text` turns a link's text into the native value, or None when the view does not offer it; `check` says
whether a native value is one the view offers. A view may narrow a range further to its model or prompt (a
head's top-k to d_ff, a position to the prompt's length); app/choice_state.py keeps the value inside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("one_of", "int", "float", "bool", "text", "ints", "pair")
MAX_TEXT = 2000  # a typed prompt or word in a view
MAX_INTS = 64  # list choices (RoPE's pairs) hold a handful


@dataclass(frozen=True)
class Choice:
    view: str  # the view that offers it
    kind: str  # one of KINDS: one_of (values), int/float (lo…hi), bool, text, ints (a list of int), pair (lo ≤ hi)
    values: tuple = ()  # one_of: what the widget offers, in its order
    lo: float | None = None
    hi: float | None = None
    default: object = None  # what the view shows without a choice; None: the view computes it (app/choice_state.py)


# Names of the published configurations the shapes table offers (explorer_model/families.py's FAMILIES; a test
# checks that the two agree, since that module needs torch and this one must not).
FAMILY_NAMES = ("LLaMA-1 7B", "LLaMA-1 13B", "LLaMA-1 33B", "LLaMA-1 65B", "Llama-2 7B", "Llama-2 70B", "Llama-3 8B")
THIS_MODEL = "__this__"
WHATIF_KINDS = ("ablate-head", "ablate-layer", "skip-attn", "skip-mlp", "no-mask", "no-rope", "norm-identity",
                "norm-eps", "scale", "gate-off", "relu", "patch")
PATCH_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
LAB_DEPTHS = (2, 4, 6, 8, 12, 16, 24, 32, 48)  # explorer_model/lab/variants.py's DEPTHS (a test checks they agree)
BIG = 1_000_000  # an upper bound for positions and counts the view narrows to its prompt or model


def _one(view: str, values: tuple, default=None) -> Choice:
    return Choice(view, "one_of", values, default=values[0] if default is None else default)


CHOICES: dict[str, Choice] = {
    # Tokens & shapes
    "tokens_family": _one("tokens", (THIS_MODEL, *FAMILY_NAMES)),
    "tokens_embed_dims": Choice("tokens", "int", lo=1, hi=BIG, default=64),
    "tokens_bos_compare": Choice("tokens", "bool", default=False),
    # Attention
    "attn_kind": _one("attention", ("pattern", "scores")),
    "attn_window": _one("attention", (4, 8, 16, 24, 32, 48, 64, 128), 24),
    "attn_link_q": Choice("attention", "int", lo=0, hi=BIG),
    "attn_link_k": Choice("attention", "int", lo=0, hi=BIG),
    "big_overview_layers": Choice("attention", "pair", lo=0, hi=BIG),
    "big_link_layers": Choice("attention", "pair", lo=0, hi=BIG),
    # RMSNorm
    "norm_which": _one("norm", ("ln1", "ln2")),
    # RoPE
    "rope_pairs": Choice("rope", "ints", lo=0, hi=BIG),
    "rope_key_token": Choice("rope", "int", lo=0, hi=BIG, default=0),
    "rope_decay_src": _one("rope", ("recorded", "ones")),
    "rope_clock_pos": Choice("rope", "int", lo=0, hi=BIG),
    # SwiGLU
    "swiglu_quantity": _one("swiglu", ("pre", "act", "up", "post", "all"), "post"),
    "swiglu_topk": Choice("swiglu", "int", lo=1, hi=256, default=32),
    "swiglu_threshold": Choice("swiglu", "float", lo=0.0, hi=10.0, default=0.1),
    "swiglu_pw_go": Choice("swiglu", "bool", default=False),  # the position-wise comparison shown (its button)
    "swiglu_pw_pos": Choice("swiglu", "int", lo=0, hi=BIG),
    "swiglu_pw_word": Choice("swiglu", "text"),
    "swiglu_prompt_a": Choice("swiglu", "text"),
    "swiglu_prompt_b": Choice("swiglu", "text"),
    "swiglu_word": Choice("swiglu", "text"),
    "swiglu_tok_a": Choice("swiglu", "int", lo=0, hi=BIG, default=0),
    "swiglu_tok_b": Choice("swiglu", "int", lo=0, hi=BIG, default=0),
    # Residual stream
    "residual_log": Choice("residual", "bool", default=False),
    "lens_positions": Choice("residual", "int", lo=1, hi=64, default=8),
    # Next token & generation
    "pred_temperature": Choice("predict", "float", lo=0.0, hi=2.0, default=1.0),
    "pred_top_k": Choice("predict", "int", lo=0, hi=BIG, default=50),
    "pred_top_p": Choice("predict", "float", lo=0.01, hi=1.0, default=0.9),
    "pred_seed": Choice("predict", "int", lo=0, hi=2**31 - 1, default=0),
    "pred_continue_n": Choice("predict", "int", lo=1, hi=64, default=20),
    # What if…
    "whatif_kind": _one("whatif", WHATIF_KINDS),
    "whatif_mean": Choice("whatif", "bool", default=False),
    "whatif_scope": _one("whatif", (True, False)),
    "whatif_norm": _one("whatif", ("ln1", "ln2", "ln_final")),
    "whatif_eps": Choice("whatif", "float", lo=0.0, hi=1e6, default=1e-2),
    "whatif_branch": _one("whatif", ("hook_attn_out", "hook_mlp_out")),
    "whatif_factor": Choice("whatif", "float", lo=-1e6, hi=1e6, default=0.5),
    "whatif_patch_hook": _one("whatif", PATCH_HOOKS),
    "whatif_patch_pos": Choice("whatif", "int", lo=-BIG, hi=BIG, default=-1),
    "big_sweep_first": Choice("whatif", "int", lo=0, hi=BIG, default=0),
    "whatif_sweep_layers": Choice("whatif", "int", lo=1, hi=BIG),
    "whatif_sweep_mode": _one("whatif", (False, True)),
    "whatif_sweep_shown": Choice("whatif", "bool", default=False),  # the sweep's result shown (its button pressed)
    # Pre vs Post-Norm lab
    "lab_ffn": _one("normlab", ("relu", "swiglu")),
    "lab_init": _one("normlab", ("xavier", "llama")),
    "lab_norm": _one("normlab", ("layer", "rms")),
    "lab_depth": _one("normlab", LAB_DEPTHS, 12),
    "lab_init_go": Choice("normlab", "bool", default=False),  # the experiment's result shown
    "lab_race_depth": _one("normlab", (2, 4, 6, 8, 12), 6),
    "lab_race_lr": _one("normlab", (3e-4, 1e-3, 3e-3, 1e-2), 3e-3),
    "lab_race_steps": Choice("normlab", "int", lo=4, hi=2000, default=150),
}


def of_view(view: str) -> list[str]:
    """The choice keys a view offers, in the table's order."""
    return [k for k, c in CHOICES.items() if c.view == view]


def values(key: str) -> tuple:
    return CHOICES[key].values


def _number(v, integer: bool) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return isinstance(v, int) if integer else math.isfinite(float(v))


def check(key: str, value) -> bool:
    """Whether `value` (native: a widget's, a lecture file's) is one the view offers under `key`."""
    c = CHOICES.get(key)
    if c is None:
        return False
    if c.kind == "one_of":
        return any(type(value) is type(v) and value == v for v in c.values) or (
            isinstance(value, int) and not isinstance(value, bool) and isinstance(c.values[0], float)
            and float(value) in c.values)
    if c.kind in ("int", "float"):
        return _number(value, c.kind == "int") and c.lo <= value <= c.hi
    if c.kind == "bool":
        return isinstance(value, bool)
    if c.kind == "text":
        return isinstance(value, str) and len(value) <= MAX_TEXT
    if c.kind == "ints":
        return isinstance(value, (list, tuple)) and len(value) <= MAX_INTS and all(
            _number(v, True) and c.lo <= v <= c.hi for v in value)
    return (isinstance(value, (list, tuple)) and len(value) == 2 and all(_number(v, True) for v in value)
            and c.lo <= value[0] <= value[1] <= c.hi)  # pair


def native(key: str, value):
    """A checked value in the widget's own type: a lecture file's 1 for a float choice is 1.0, a list a tuple."""
    c = CHOICES[key]
    if c.kind == "one_of":
        return next(v for v in c.values if v == value)
    if c.kind == "float":
        return float(value)
    if c.kind == "pair":
        return (int(value[0]), int(value[1]))
    if c.kind == "ints":
        return [int(v) for v in value]
    return value


def to_text(key: str, value) -> str:
    """The link's form of a value: 1/0 for a flag, "a,b" for a list or a pair, repr-exact numbers."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(str(int(v)) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def from_text(key: str, text: str):
    """The native value a link's text stands for, or None when the view does not offer it (a bad link falls back to
    the view's default)."""
    c = CHOICES.get(key)
    if c is None or not isinstance(text, str) or len(text) > MAX_TEXT:
        return None
    try:
        if c.kind == "one_of":
            found = [v for v in c.values if to_text(key, v) == text or (not isinstance(v, (bool, str))
                                                                          and float(text) == v)]
            return found[0] if found else None
        if c.kind == "bool":
            return {"1": True, "0": False}.get(text)
        if c.kind == "text":
            value = text
        elif c.kind == "int":
            value = int(text)
        elif c.kind == "float":
            value = float(text)
        else:
            value = [int(v) for v in text.split(",") if v.strip()]
            value = tuple(value) if c.kind == "pair" else value
    except ValueError:
        return None
    return native(key, value) if check(key, value) else None


def _range(c: Choice) -> str:
    """lo … hi, an open end where the view narrows the range to its model or prompt."""
    ends = ["" if abs(v) >= BIG else f"{v:g}" for v in (c.lo, c.hi)]
    return f"{ends[0]} … {ends[1]}".strip() if any(ends) else "any"


def allowed_words(key: str) -> str:
    """What a key allows, for a lecture's one-line mistake and the docs: its values, or its range."""
    c = CHOICES[key]
    if c.kind == "one_of":
        return ", ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in c.values)
    if c.kind in ("int", "float"):
        return _range(c)
    if c.kind == "ints":
        return f"a list, each {_range(c)}"
    if c.kind == "pair":
        return f"[first, last], each {_range(c)}"
    return "true, false" if c.kind == "bool" else "text"


def markdown() -> str:
    """The choices' table of docs/lectures.md (a test checks the page holds it)."""
    rows = ["| view | choice | values | default |", "|---|---|---|---|"]
    for key, c in CHOICES.items():
        default = "the view's" if c.default is None else str(c.default).lower() if isinstance(c.default, bool) \
            else to_text(key, c.default)
        shown = ", ".join(f"`{v}`" for v in allowed_words(key).split(", ")) if c.kind == "one_of" else \
            allowed_words(key)  # code spans: a value such as __this__ is no markdown
        rows.append(f"| {c.view} | `{key}` | {shown} | {default if c.default is None else f'`{default}`'} |")
    return "\n".join(rows)
