"""What every panel receives: the loaded model, one recording, and the shared selection.

Panels read tensors only through `ctx.rec` (a Recording); they never run the model. The one exception
is the prediction panel's explicit "append token" step, which records a new prompt through `state`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from explorer_model.recording import Recording


@dataclass
class ViewContext:
    loaded: object  # explorer_model.loaders.LoadedModel
    rec: Recording
    ids: list[int]  # token ids of the (possibly truncated) prompt
    pieces: list[str]  # display text of each token
    layer: int
    head: int
    token: int  # position index into ids
    lang: str = "en"  # "en" | "zh"
    presenter: bool = False
    extras: dict = field(default_factory=dict)

    @property
    def cfg(self):
        return self.loaded.model.cfg

    @property
    def model(self):
        return self.loaded.model

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def labels(self) -> list[str]:
        """Unique axis labels 'position:piece' (Plotly merges equal category labels)."""
        return [f"{i}:{p}" for i, p in enumerate(self.pieces)]

    def t(self, en: str, zh: str) -> str:
        return zh if self.lang == "zh" else en


def display_piece(text: str) -> str:
    """Make whitespace visible in token labels: a leading space as '␣', newline as '↵', tab as '⇥'."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"
