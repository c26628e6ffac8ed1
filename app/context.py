"""What every panel receives: one recording, the model's facts, the shared selection and the language.

Panels see data, not the model: `rec` is a Recording, `facts` a ModelFacts (config, γ of every norm,
parameter counts, tokenizer facts). Work that needs the model (the logit lens, a what-if run, the head
sweep, the twins, lab experiments, the rows of the embedding) is asked of the gateway, app/gateway/__init__.py,
through its public functions; a panel never imports torch, the model, the loaders or the gateway's internals.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from app import i18n
from app.facts import ModelFacts
from app.screen import DESKTOP, Screen
from explorer_model.recording import Recording
from explorer_model.tokenizer.labels import fragment_labels


@dataclass
class ViewContext:
    facts: ModelFacts
    rec: Recording
    ids: list[int]  # token ids of the (possibly truncated) prompt
    pieces: list[str]  # display text of each token
    layer: int
    head: int
    token: int  # position index into ids
    lang: str = "en"  # "en" | "zh"
    presenter: bool = False
    screen: Screen = DESKTOP  # the visitor's screen (app/screen.py): figures are sized to it
    # "source": the model's name in the gateway. Step generation (the prompt is kept as token ids, so half a
    # character never becomes U+FFFD): "append_token"(id) adds one token to the prompt, "append_tokens"(ids)
    # several as one step ("token_limit": how many tokens a prompt may have), "undo"() returns to the ids before
    # the last append, "can_undo" says whether there is one. Both are meant for a button's on_click;
    # called in the script body, follow them with st.rerun(). "replace_prompt"(text, **state) sets a new prompt
    # (and the state that goes with it) and keeps the visitor's whole state for "back to my prompt": "back"() gives
    # it back, "mine_prompt" is its prompt (None when nothing is kept).
    extras: dict = field(default_factory=dict)

    def figure_digest(self) -> tuple:
        """What a figure drawn from this context may depend on (app/gateway/figures.py): the model (its facts
        object: a reloaded file gets new facts), the prompt, the selection, the language and presenter mode."""
        return (self.source, id(self.facts), tuple(self.ids), tuple(self.pieces), self.layer, self.head, self.token,
                self.lang, self.presenter)

    def method_reads(self, name: str) -> tuple:
        """What the method `name` reads of this context, for a figure that closes over it: `t` only the language (a
        figure that names its axes in the visitor's language is the same figure for every prompt and selection)."""
        return (self.lang,) if name == "t" else self.figure_digest()

    @property
    def cfg(self):
        return self.facts.cfg

    @property
    def source(self) -> str:
        return self.extras.get("source", self.facts.source)

    @property
    def labels(self) -> list[str]:
        """Unique axis labels 'position:piece' (Plotly merges equal category labels)."""
        return [f"{i}:{p}" for i, p in enumerate(self.pieces)]

    def t(self, key: str, zh: str | None = None, **values) -> str:
        """The catalog message `key` in this visitor's language (app/i18n.py), placeholders filled from values.

        (The inline form t(english, chinese) returns one of its two texts without a catalog; the catalog test
        fails as long as any remains.)"""
        if zh is not None:
            return zh if self.lang == "zh" else key
        return i18n.t(key, self.lang, **values)


def token_labels(facts: ModelFacts, ids) -> list[str]:
    """Display text of each token of a sequence: a piece of a UTF-8 character split over several tokens is named by
    its character and part (char·1/3, explorer_model.tokenizer.labels), special tokens keep their text, whitespace is shown."""
    ids = [int(i) for i in ids]
    frags = fragment_labels([facts.token_bytes(i) for i in ids])
    return [display_piece(facts.piece(i) if facts.is_special(i) else f) for i, f in zip(ids, frags)]


# the names of a model's parts (ModelConfig's norm_placement, norm_type, ffn_type), the same in both languages
ARCH_NAMES = {"pre": "Pre-Norm", "post": "Post-Norm", "rms": "RMSNorm", "layer": "LayerNorm", "swiglu": "SwiGLU",
              "relu": "ReLU"}


def display_piece(text: str) -> str:
    """A token's label: whitespace made visible (a space as '␣', newline as '↵', tab as '⇥', a token of other
    invisible characters by their code points, ‹U+00A0›), and angle brackets as ‹ ›, for Plotly reads the text of an axis, a cell or a hover as HTML: "<s>" (LLaMA's BOS) would strike through
    the labels after it and show nothing itself."""
    shown = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("<", "‹").replace(">", "›")
    if shown and not any(c.isprintable() and not c.isspace() for c in shown):  # only invisible characters (a
        return "".join(f"‹U+{ord(c):04X}›" for c in shown)  # no-break space, U+3000): named, not an empty cell
    return shown or "∅"


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>!|~:$])")


def plain(text) -> str:
    """User input (a URL parameter, a prompt, a file name, an error that quotes them) made safe to put inside
    Streamlit markdown: the marks that make links, images, HTML, emphasis, code, LaTeX, emoji/icon shortcodes and
    bare-URL autolinks (`://`) are backslash-escaped, so `[x](http://…)` and `![i](…)` show as typed, never as a
    link or an image. One line: newlines become spaces (no headings or lists either)."""
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\n", " ")
