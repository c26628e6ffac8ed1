"""The sidebar: model, prompt (kept as token ids once a token is appended), presets as lessons, BOS and the
recording's download (the presets and the shared selection stand where app/controls.py puts them).

Prompt state (st.session_state):
  prompt     the text in the prompt box;
  ids        token ids that ARE the prompt (without an app-prepended BOS) after step generation, or None; valid
             while the box still shows ids_text (a hand edit drops them), so half a character appended by the
             residual view stays an id and never becomes U+FFFD in the box or the URL;
  ids_history  earlier (prompt, ids, ids_text) states, for undo;
  my_state   the visitor's whole state (MINE) before a preset or replace_prompt replaced it ("back to my prompt");
  _pending   state to set before the widgets of the next run exist (callbacks may run after they do);
  _pending_drop  keys to remove then.
"""
from __future__ import annotations

import streamlit as st

from app import gateway, sections
from app.context import ARCH_NAMES, plain
from app.controls import Places
from app.facts import ModelFacts
from app.i18n import t
from app.plots import npz_button, waiting
from app.presets import BY_KEY, PRESETS, opened
from explorer_model.memory import count_text

OTHER = "__other__"
PROMPT_STATE = ("prompt", "ids", "ids_text")
# What "back to my prompt" gives back: the model, the prompt, BOS, the view and its section, the selection, the
# comparison and its B, the What-if interventions and the lesson.
MINE = ("active_model", *PROMPT_STATE, "bos", "view", "section", "layer", "head", "token", "_token_auto", "cmp",
        "cmp_prompt", "cmp_model", "cmp_iv", "cmp_align", "whatif", "whatif_source", "lesson")
REDRAWN = ("whatif_specs", "whatif_source_text", "_lesson_pending")  # filled again from what MINE restores


def tr(key: str, **values) -> str:
    return t(key, st.session_state.get("lang", "en"), **values)


# --------------------------------------------------------------------------- model
def choose_model() -> ModelFacts | None:
    """The model in use. A failed load keeps the previous model and says why.

    Visitors of a shared server choose from a list; locally any path the loader accepts may be typed.
    """
    offered = gateway.offered_models()
    options = offered if gateway.shared() else offered + [OTHER]
    if "active_model" not in st.session_state:
        wanted = st.query_params.get("model") or gateway.default_source()
        st.session_state.active_model = gateway.default_source()
        if wanted in offered:
            st.session_state.model_pick = wanted
        elif gateway.shared():
            st.session_state.load_error = (wanted, tr("sidebar.shared_only"))
        else:
            st.session_state.model_pick, st.session_state.model_input = OTHER, wanted
    sb = st.sidebar
    pick = sb.selectbox(tr("sidebar.model"), options, key="model_pick",
                        format_func=lambda o: tr("sidebar.other_model") if o == OTHER else o)
    wanted = pick
    if pick == OTHER:
        sb.text_input(tr("sidebar.path"), key="model_input")
        wanted = (st.session_state.get("model_input") or "").strip() or st.session_state.active_model
    if wanted != st.session_state.active_model:
        with st.spinner(tr("sidebar.loading_source", source=plain(wanted))):
            facts, err = gateway.try_load(wanted)
        if facts is None:
            st.session_state.load_error = (wanted, err)
        else:
            st.session_state.active_model = wanted
            st.session_state.pop("load_error", None)
    if st.session_state.get("load_error"):
        bad, err = st.session_state.load_error
        sb.error(tr("sidebar.load_error", source=plain(bad), error=plain(load_reason(err)),
                    now=plain(st.session_state.active_model)))  # user input: never markdown
    with waiting(tr("sidebar.loading"), not gateway.model_ready(st.session_state.active_model)):
        facts, err = gateway.try_load(st.session_state.active_model)
    if facts is None:
        st.error(tr("sidebar.load_failed", source=plain(st.session_state.active_model), error=plain(load_reason(err))))
        return None
    sb.caption(model_caption(facts))
    return facts


# --------------------------------------------------------------------------- prompt, kept as ids
def apply_pending() -> None:
    """Called first in every run: state set by callbacks (append, undo, presets) lands before the widgets exist."""
    for key in st.session_state.pop("_pending_drop", None) or ():
        st.session_state.pop(key, None)
    pending = st.session_state.pop("_pending", None)
    if pending:
        st.session_state.update(pending)


def clean_text(facts: ModelFacts, body: list[int]) -> str:
    """The prompt text of token ids without U+FFFD: an unfinished character at the end (an appended fragment) is
    left out of the text; the ids keep it."""
    text = facts.decode(body)
    if "\ufffd" not in text:
        return text
    data = b"".join(facts.piece(i).encode() if facts.is_special(i) else facts.token_bytes(i) for i in body)
    return data.decode("utf-8", errors="ignore")


def _state() -> dict:
    return {k: st.session_state.get(k) for k in PROMPT_STATE}


def step_api(facts: ModelFacts, body: list[int]) -> dict:
    """The ViewContext extras for step generation (see app/context.py). body: the prompt's ids without an
    app-prepended BOS."""
    def append_tokens(new_ids) -> None:
        st.session_state["ids_history"] = [*(st.session_state.get("ids_history") or []), _state()]
        ids = list(body) + [int(i) for i in new_ids]
        text = clean_text(facts, ids)
        st.session_state["_pending"] = {"prompt": text, "ids": ids, "ids_text": text}

    def append_token(new_id: int) -> None:
        append_tokens([new_id])

    def undo() -> None:
        hist = list(st.session_state.get("ids_history") or [])
        if hist:
            st.session_state["_pending"] = hist.pop()
            st.session_state["ids_history"] = hist

    limit = min(int(st.session_state.get("max_tokens") or facts.cfg.max_seq_len), gateway.token_cap(),
                facts.cfg.max_seq_len)  # what prompt_ids keeps of a longer prompt
    mine = st.session_state.get("my_state")
    return {"append_token": append_token, "append_tokens": append_tokens, "undo": undo,
            "can_undo": bool(st.session_state.get("ids_history")), "replace_prompt": replace_prompt,
            "back": back, "mine_prompt": mine.get("prompt") if mine else None, "token_limit": limit}


def keep_mine() -> None:
    """The visitor's whole state, kept once, before a preset or a lesson's button replaces it."""
    ss = st.session_state
    if not ss.get("my_state"):
        ss["my_state"] = {k: ss[k] for k in MINE if k in ss}


def replace_prompt(text: str, keep: bool = True, **state) -> None:
    """Set a new prompt and whatever else goes with it (a preset's view and lesson, the bank lesson's patch),
    keeping the visitor's own state for "back to my prompt"."""
    if keep:
        keep_mine()
    st.session_state["_pending"] = {"prompt": text, "ids": None, "ids_text": None, **state, "replaced_by": text}


def back() -> None:
    """The visitor's state as it was before the first preset replaced it (a button's callback)."""
    ss = st.session_state
    mine = ss.pop("my_state", None)
    if not mine:
        return
    ss["_pending"] = {**mine, "model_pick": mine.get("active_model", gateway.default_source())}
    ss["_pending_drop"] = [k for k in MINE if k not in mine] + list(REDRAWN)
    sections.request(mine.get("view"), mine.get("section"))


def _choose_preset() -> None:
    key = st.session_state.get("preset")
    if key in BY_KEY:
        state = opened(key)
        replace_prompt(state.pop("prompt"), **state)
        sections.request(BY_KEY[key].view, BY_KEY[key].section)
    st.session_state["preset"] = None


def sidebar_prompt(facts: ModelFacts | None, places: Places) -> str:
    sb = st.sidebar
    places.preset.selectbox(tr("sidebar.preset"), [p.key for p in PRESETS], index=None, key="preset",
                            on_change=_choose_preset, format_func=lambda k: tr(f"preset.{k}"),
                            placeholder=tr("sidebar.preset_placeholder"))
    if "prompt" not in st.session_state:
        st.session_state.prompt = PRESETS[0].prompt
    if st.session_state.get("my_state") and st.session_state.get("prompt") != st.session_state.get("replaced_by"):
        st.session_state.pop("my_state")  # the visitor made the new prompt theirs: nothing to go back to
    if st.session_state.get("my_state"):
        places.preset.button(tr("sidebar.back"), on_click=back, key="back_to_mine")
    sb.text_area(tr("sidebar.prompt"), key="prompt", height=110, max_chars=gateway.prompt_char_limit())
    if st.session_state.get("ids") and st.session_state.get("prompt") != st.session_state.get("ids_text"):
        st.session_state.update(ids=None, ids_text=None, ids_history=[])  # edited by hand
    st.session_state["max_tokens"] = min(int(st.session_state.get("max_tokens") or default_max_tokens()),
                                         gateway.token_cap())  # a link's, within this server's limit
    sb.number_input(tr("sidebar.token_limit"), min_value=1, max_value=gateway.token_cap(), step=64, key="max_tokens")
    if facts is not None and facts.bos_id is not None:
        if facts.add_bos:
            sb.caption(tr("sidebar.bos_self"))
        else:
            sb.toggle(tr("sidebar.bos"), key="bos", help=tr("sidebar.bos_help"))
            sb.caption(tr("sidebar.bos_not"))
    return st.session_state.get("prompt") or ""


def default_max_tokens() -> int:
    return min(gateway.DEFAULT_MAX_TOKENS, gateway.token_cap())


def prompt_ids(facts: ModelFacts, source: str, prompt: str, max_tokens: int) -> tuple[list[int], list[int], int]:
    """(ids the model reads, body = ids without an app-prepended BOS, length before the cut)."""
    bos = [facts.bos_id] if st.session_state.get("bos") and facts.bos_id is not None and not facts.add_bos else []
    kept = st.session_state.get("ids")
    if kept:
        limit = max(1, min(max_tokens, gateway.token_cap(), facts.cfg.max_seq_len) - len(bos))
        body, n_total = list(kept)[:limit], len(kept)
    else:
        body, n_total = gateway.encode_prompt(source, prompt, max(1, max_tokens - len(bos)))
    if kept and "\ufffd" in facts.decode(body):  # the last character is unfinished: shown only by the views
        st.sidebar.caption(tr("sidebar.partial"))
    return bos + body, body, n_total + len(bos)


def url_ids(source: str, prompt: str, body: list[int]) -> str:
    """The URL's `ids=` value: the ids, when the prompt text does not give them back (else "")."""
    if not st.session_state.get("ids"):
        return ""
    again, _ = gateway.encode_prompt(source, prompt, len(body) + 1)
    return "" if list(again) == list(body) else ",".join(str(i) for i in body)


def parse_ids(text: str, vocab_size: int) -> list[int] | None:
    """ids from the URL: a comma list of token ids inside the vocabulary, else None."""
    try:
        ids = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        return None
    return ids if ids and all(0 <= i < vocab_size for i in ids) else None


# --------------------------------------------------------------------------- download
def npz_data(source: str, ids) -> callable:
    """The download's data callable. Streamlit calls it when the browser fetches the file, outside any script
    run, where st.session_state does not exist: it holds the model's name and the ids, nothing else."""
    ids = tuple(int(i) for i in ids)
    return lambda: gateway.recording_npz(source, ids)


def download(source: str, ids) -> None:
    npz_button(st.sidebar, tr("sidebar.download"), source, len(ids), npz_data(source, ids), "recording.npz",
               "download_npz", st.session_state.get("lang", "en"))


def model_caption(facts: ModelFacts) -> str:
    """The model in one line, in the visitor's language (the loaders' own description is English)."""
    cfg, n = facts.cfg, facts.param_counts["total"]
    size = count_text(n)
    origin = facts.description.rsplit("; ", 1)[-1]  # the file format and its tensor types, e.g. "GGUF Q4_1/F32"
    if facts.format == "native":  # this project's own format: the loader names the architecture in English
        origin = tr("sidebar.native_origin", placement=ARCH_NAMES[cfg.norm_placement], norm=ARCH_NAMES[cfg.norm_type],
                    ffn=ARCH_NAMES[cfg.ffn_type])
    return tr("sidebar.model_caption", name=plain(cfg.name), params=size, layers=cfg.n_layers, d_model=cfg.d_model,
              heads=cfg.n_heads, kv=cfg.n_kv_heads, vocab=cfg.vocab_size, tied=tr("sidebar.tied") if facts.tied else "",
              origin=plain(origin), dtype=facts.dtype)


# The loaders' one-line errors are English (CLI and API); the page names the most common classes in the visitor's
# language, recognised by the loaders' own wording, and keeps the exact line for everything else.
LOAD_ERROR_CLASSES = (
    ("no such file or folder", "missing"), ("no such model file or folder", "missing"),
    ("symbolic link that leads nowhere", "link"), ("no such user", "user"), ("not a GGUF file", "not_gguf"),
    ("truncated or corrupt", "corrupt"), ("shape mismatch", "shape"), ("layers but the weights hold", "layers"),
    ("tokenizer has", "tokenizer"), ("not a readable PyTorch checkpoint", "pickle"), ("needs about", "memory"),
    ("not a readable safetensors file", "safetensors"), ("no weights", "no_weights"),
    ("must be a finite number", "number"), ("not a readable JSON file", "json"),
)


def load_reason(err: str) -> str:
    """Why a model did not load, in the visitor's language (the exact English line when the UI is English)."""
    if st.session_state.get("lang") != "zh" or not err.isascii():  # English, or already in the visitor's language
        return err
    key = next((k for needle, k in LOAD_ERROR_CLASSES if needle in err), None)
    return tr(f"sidebar.why.{key}") if key else tr("sidebar.why.other", detail=err)
