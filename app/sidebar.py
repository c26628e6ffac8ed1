"""The sidebar: model, prompt (kept as token ids once a token is appended), presets as lessons, BOS, selection,
the recording's download and, on a shared server, the room's address with a QR code.

Prompt state (st.session_state):
  prompt     the text in the prompt box;
  ids        token ids that ARE the prompt (without an app-prepended BOS) after step generation, or None; valid
             while the box still shows ids_text (a hand edit drops them), so half a character appended by the
             residual view stays an id and never becomes U+FFFD in the box or the URL;
  ids_history  earlier (prompt, ids, ids_text) states, for undo;
  my_prompt  the visitor's prompt before a preset or replace_prompt replaced it ("back to my prompt");
  _pending   state to set before the widgets of the next run exist (callbacks may run after they do).
"""
from __future__ import annotations

import functools
import io

import streamlit as st

from app import gateway
from app.context import plain
from app.facts import ModelFacts
from app.i18n import error_text, t
from app.presets import BY_KEY, PRESETS

OTHER = "__other__"
PROMPT_STATE = ("prompt", "ids", "ids_text")


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
        wanted = st.query_params.get("model") or gateway.DEFAULT_SOURCE
        st.session_state.active_model = gateway.DEFAULT_SOURCE
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
    with st.spinner(tr("sidebar.loading")):
        facts, err = gateway.try_load(st.session_state.active_model)
    if facts is None:
        st.error(tr("sidebar.load_failed", source=plain(st.session_state.active_model), error=plain(load_reason(err))))
        return None
    sb.caption(model_caption(facts))
    return facts


# --------------------------------------------------------------------------- prompt, kept as ids
def apply_pending() -> None:
    """Called first in every run: state set by callbacks (append, undo, presets) lands before the widgets exist."""
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
    return {"append_token": append_token, "append_tokens": append_tokens, "undo": undo,
            "can_undo": bool(st.session_state.get("ids_history")), "replace_prompt": replace_prompt,
            "token_limit": limit}


def replace_prompt(text: str, keep_mine: bool = True) -> None:
    """Set a new prompt (a preset, a what-if pair), keeping the visitor's own for "back to my prompt"."""
    if keep_mine and not st.session_state.get("my_prompt"):
        st.session_state["my_prompt"] = _state()
    st.session_state["_pending"] = {"prompt": text, "ids": None, "ids_text": None, "replaced_by": text}


def _back() -> None:
    mine = st.session_state.pop("my_prompt", None)
    if mine:
        st.session_state["_pending"] = {**mine}
        st.session_state.pop("lesson", None)


def _choose_preset() -> None:
    key = st.session_state.get("preset")
    if key in BY_KEY:
        replace_prompt(BY_KEY[key].prompt)
        st.session_state["_pending"].update(bos=False)  # lessons are found on the prompt as the model reads it
        if BY_KEY[key].kind == "compare":  # a comparison brings its B (and, for the twins, the model)
            st.session_state["_pending"].update(dict(BY_KEY[key].args))
        st.session_state["lesson"], st.session_state["_lesson_pending"] = key, True
    st.session_state["preset"] = None


def sidebar_prompt(facts: ModelFacts | None) -> str:
    sb = st.sidebar
    sb.selectbox(tr("sidebar.preset"), [p.key for p in PRESETS], index=None, key="preset",
                 on_change=_choose_preset, format_func=lambda k: tr(f"preset.{k}"),
                 placeholder=tr("sidebar.preset_placeholder"))
    if "prompt" not in st.session_state:
        st.session_state.prompt = PRESETS[0].prompt
    if st.session_state.get("my_prompt") and st.session_state.get("prompt") != st.session_state.get("replaced_by"):
        st.session_state.pop("my_prompt")  # the visitor made the new prompt theirs: nothing to go back to
    if st.session_state.get("my_prompt"):
        sb.button(tr("sidebar.back"), on_click=_back, key="back_to_mine")
    sb.text_area(tr("sidebar.prompt"), key="prompt", height=110, max_chars=gateway.prompt_char_limit())
    if st.session_state.get("ids") and st.session_state.get("prompt") != st.session_state.get("ids_text"):
        st.session_state.update(ids=None, ids_text=None, ids_history=[])  # edited by hand
    sb.number_input(tr("sidebar.token_limit"), min_value=1, max_value=gateway.token_cap(),
                    value=min(gateway.DEFAULT_MAX_TOKENS, gateway.token_cap()), step=64, key="max_tokens")
    if facts is not None and facts.bos_id is not None:
        if facts.add_bos:
            sb.caption(tr("sidebar.bos_self"))
        else:
            sb.toggle(tr("sidebar.bos"), key="bos", help=tr("sidebar.bos_help"))
            sb.caption(tr("sidebar.bos_not"))
    return st.session_state.get("prompt") or ""


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


# --------------------------------------------------------------------------- selection and download
def selection(facts: ModelFacts, ids: list[int], pieces: list[str]) -> tuple[int, int, int]:
    cfg, sb = facts.cfg, st.sidebar
    if st.session_state.get("_token_auto", True):  # the token whose prediction is shown, until the visitor moves it
        st.session_state.token = len(ids) - 1
    for key, hi in (("layer", cfg.n_layers - 1), ("head", cfg.n_heads - 1), ("token", len(ids) - 1)):
        _clamp(key, hi)
    sb.divider()
    sb.slider(tr("sidebar.layer"), 0, max(cfg.n_layers - 1, 1), key="layer", disabled=cfg.n_layers == 1)
    sb.slider(tr("sidebar.head"), 0, max(cfg.n_heads - 1, 1), key="head", disabled=cfg.n_heads == 1,
              help=tr("sidebar.head_help", n_rep=cfg.n_rep))
    sb.slider(tr("sidebar.token"), 0, max(len(ids) - 1, 1), key="token", disabled=len(ids) == 1,
              on_change=lambda: st.session_state.update(_token_auto=False))
    layer = min(int(st.session_state.layer), cfg.n_layers - 1)
    head = min(int(st.session_state.head), cfg.n_heads - 1)
    token = min(int(st.session_state.token), len(ids) - 1)
    sb.caption(tr("sidebar.token_caption", token=token, piece=plain(pieces[token]), id=ids[token], head=head,
                  kv=head // cfg.n_rep))
    return layer, head, token


def _clamp(key: str, hi: int) -> None:
    """A link made for a bigger model or a longer prompt must not break the sliders."""
    try:
        v = int(st.session_state.get(key))
    except (TypeError, ValueError):
        v = 0
    st.session_state[key] = min(max(v, 0), hi)


def npz_data(source: str, ids) -> callable:
    """The download's data callable. Streamlit calls it when the browser fetches the file, outside any script
    run, where st.session_state does not exist: it holds the model's name and the ids, nothing else."""
    ids = tuple(int(i) for i in ids)
    return lambda: gateway.recording_npz(source, ids)


def download(source: str, ids) -> None:
    try:
        gateway.check_export(source, len(ids))
    except gateway.RunRefused as e:  # over the server's download cap: said here, before anyone clicks
        st.sidebar.caption(error_text(e, st.session_state.get("lang", "en")))
        return
    st.sidebar.download_button(tr("sidebar.download"), data=npz_data(source, ids), file_name="recording.npz",
                               mime="application/octet-stream", on_click="ignore", key="download_npz")


# --------------------------------------------------------------------------- the room's address (share mode)
def room_addresses() -> list[str]:
    from explorer_model.cli import serve

    return serve.lan_addresses()  # every non-loopback interface, read from the kernel


@functools.lru_cache(maxsize=8)
def qr_png(url: str) -> bytes:
    """The address as a QR code, made once per address (every page run of a shared server shows it)."""
    import segno  # pure Python; only needed on a shared server

    buf = io.BytesIO()
    segno.make(url, error="m").save(buf, kind="png", scale=8, border=2)
    return buf.getvalue()


def share_box(port: int) -> None:
    """For the projector: every address students can open, the first as a QR code."""
    urls = [f"http://{a}:{port}/" for a in room_addresses()]
    if not urls:
        return
    with st.expander(tr("sidebar.share_title"), expanded=bool(st.session_state.get("presenter"))):
        st.code("\n".join(urls), language=None)
        st.image(qr_png(urls[0]), caption=tr("sidebar.share_caption", url=urls[0]), width=240, output_format="PNG")


def model_caption(facts: ModelFacts) -> str:
    """The model in one line, in the visitor's language (the loaders' own description is English)."""
    cfg, n = facts.cfg, facts.param_counts["total"]
    size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"
    origin = facts.description.rsplit("; ", 1)[-1]  # the file format and its tensor types, e.g. "GGUF Q4_1/F32"
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
    ("must be a finite number", "number"),
)


def load_reason(err: str) -> str:
    """Why a model did not load, in the visitor's language (the exact English line when the UI is English)."""
    if st.session_state.get("lang") != "zh" or not err.isascii():  # English, or already in the visitor's language
        return err
    key = next((k for needle, k in LOAD_ERROR_CLASSES if needle in err), None)
    return tr(f"sidebar.why.{key}") if key else tr("sidebar.why.other", detail=err)
