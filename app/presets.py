"""Classroom prompts, each a guided lesson: choosing one sets the view, layer, head and token to where its point is
visible, scrolls to the part of the view that shows it (its section, app/sections.py) and shows one sentence saying
what to look for.

Where to look is FOUND on the model in use (app.gateway.lesson_target, once per server per model and preset), never
typed in: the head where "it" attends most to "animal", the strongest induction head, the strongest sink head, the
layer where the logit lens first shows the final prediction. The label of preset `key` is the catalog message
`preset.{key}`, its sentence `preset.lesson.{kind}` with the measured values as placeholders.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    key: str
    prompt: str
    view: str  # the view that shows the point
    kind: str  # how the target is found: link | induction | sink | split | lens | special | compare
    args: tuple = field(default=())  # link: (query word, key word); compare: (state key, value) pairs (B, model)
    section: str | None = None  # the part of the view that shows the point (None: the view's top)


PRESETS: list[Preset] = [
    Preset("coref", "The animal didn't cross the street because it was too tired.", "attention", "link",
           ("it", "animal"), section="head"),
    Preset("sink", "I love machine learning.", "attention", "sink", section="head"),
    Preset("zh_split", "\u6df1\u5ea6\u5b66\u4e60\u5f88", "tokens", "split", section="pieces"),
    Preset("bank_money", "The bank approved the loan.", "attention", "link", ("loan", "bank"), section="head"),
    Preset("bank_river", "The bank near the river collapsed.", "attention", "link", ("river", "bank"), section="head"),
    # every word starts with a space, so both copies are the same tokens (the first word would differ otherwise)
    Preset("induction", "Words: red lamp cat seven tree blue moon door red lamp cat seven tree blue moon door",
           "attention", "induction", section="head"),
    Preset("fact", "The capital of France is", "residual", "lens", section="lens"),
    Preset("zh_sentence", "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u3002", "tokens", "split",
           section="pieces"),
    Preset("chat", "<|im_start|>user\nWhat is RoPE?<|im_end|>\n<|im_start|>assistant\n", "tokens", "special",
           section="pieces"),
]

# Comparisons (compare mode, app/compare.py): the preset's prompt is A; args set B (and the model where it matters).
PRESETS += [
    Preset("compare_bank", "The bank of the river", "residual", "compare",
           (("cmp", "prompt"), ("cmp_prompt", "The bank approved the loan"))),
    Preset("compare_twins", "Shall I compare thee to a summer's day?", "norm", "compare",
           (("model_pick", "tiny-pre"), ("cmp", "model"), ("cmp_model", "tiny-post"))),
    # word order scrambled (the last word kept): without RoPE only the causal mask still tells positions apart
    Preset("compare_rope", "on cat the sat The mat.", "attention", "compare", (("cmp", "whatif"), ("cmp_iv", "no-rope"))),
]

BY_KEY = {p.key: p for p in PRESETS}
BANK_PAIR = (BY_KEY["bank_money"].prompt, BY_KEY["bank_river"].prompt)


def opened(key: str) -> dict:
    """The page state preset `key` sets: its prompt as text (no BOS: a lesson is found on the prompt as the model
    reads it), its view, its lesson (found on the model at the next run, app/main.py) and, for a comparison, its B
    and the model it needs."""
    preset = BY_KEY[key]
    state = {"prompt": preset.prompt, "ids": None, "ids_text": None, "bos": False, "view": preset.view,
             "lesson": key, "_lesson_pending": True}
    if preset.kind == "compare":
        state.update(dict(preset.args))
        if "model_pick" in state:
            state["active_model"] = state["model_pick"]
    return state
