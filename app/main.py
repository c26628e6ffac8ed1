"""LLaMA Explorer: `streamlit run app/main.py`. Sidebar and layout only; each view lives in app/panels.

State that a copied link must reproduce (model, prompt, language, view, layer, head, token) is read
from the URL's query parameters once per session and written back after every run. (Streamlit's own
widget binding keys options by their displayed label, which changes with the language.)
"""
from __future__ import annotations

import logging

import explorer_model  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)
import streamlit as st
from explorer_model.runtime import keep_freed_memory

from app import explorer
from app.context import ViewContext, display_piece, plain
from app.panels import VIEWS
from app.presets import PRESETS

log = logging.getLogger("llama_explorer.app")
URL_KEYS = ("lang", "view", "layer", "head", "token", "prompt", "whatif", "whatif_source")

st.set_page_config(page_title="LLaMA Explorer", page_icon="🦙", layout="wide")
keep_freed_memory()  # each new prompt's recording reuses the memory of evicted ones


def tr(en: str, zh: str) -> str:
    return zh if st.session_state.get("lang") == "zh" else en


def clamp_state(key: str, hi: int) -> None:
    """A link made for a bigger model or a longer prompt must not break the sliders."""
    v = st.session_state.get(key)
    try:
        v = int(v)
    except (TypeError, ValueError):
        v = 0
    st.session_state[key] = min(max(v, 0), hi)


OTHER = "__other__"


def choose_model():
    """The model in use. A failed load keeps the previous model and says why.

    Visitors of a shared server choose from a list; locally any path the loader accepts may be typed.
    """
    offered = explorer.offered_models()
    options = offered if explorer.shared() else offered + [OTHER]
    if "active_model" not in st.session_state:
        wanted = st.query_params.get("model") or explorer.DEFAULT_SOURCE
        st.session_state.active_model = explorer.DEFAULT_SOURCE
        if wanted in offered:
            st.session_state.model_pick = wanted
        elif explorer.shared():
            st.session_state.load_error = (wanted, tr("this server only offers the models in its list",
                                                      "此服务器只提供列表中的模型"))
        else:
            st.session_state.model_pick, st.session_state.model_input = OTHER, wanted
    sb = st.sidebar
    pick = sb.selectbox(tr("Model", "模型"), options, key="model_pick",
                        format_func=lambda o: tr("Other (a path on this computer)…", "其他（本机上的路径）…")
                        if o == OTHER else o)
    wanted = pick
    if pick == OTHER:
        sb.text_input(tr("Path to a .gguf file, an HF folder or a Meta folder", "GGUF 文件、HF 文件夹或 Meta 文件夹的路径"),
                      key="model_input")
        wanted = (st.session_state.get("model_input") or "").strip() or st.session_state.active_model
    if wanted != st.session_state.active_model:
        with st.spinner(tr(f"Loading {plain(wanted)} …", f"正在加载 {plain(wanted)} …")):
            facts, err = explorer.try_load(wanted)
        if facts is None:
            st.session_state.load_error = (wanted, err)
        else:
            st.session_state.active_model = wanted
            st.session_state.pop("load_error", None)
    if st.session_state.get("load_error"):
        bad, err = st.session_state.load_error
        bad, err, now = plain(bad), plain(err), plain(st.session_state.active_model)  # user input: never markdown
        sb.error(tr(f"Could not load {bad}: {err}. Still using {now}.", f"无法加载 {bad}：{err}。仍在使用 {now}。"))
    with st.spinner(tr("Loading the model …", "正在加载模型 …")):
        facts, err = explorer.try_load(st.session_state.active_model)
    if facts is None:
        now, err = plain(st.session_state.active_model), plain(err)
        st.error(tr(f"Could not load {now}: {err}", f"无法加载 {now}：{err}"))
        return None
    sb.caption(plain(facts.description))
    return facts


def apply_preset() -> None:
    i = st.session_state.get("preset")
    if i is not None:
        st.session_state.prompt = PRESETS[i][2]


def sidebar_prompt() -> str:
    sb = st.sidebar
    sb.selectbox(tr("Preset", "预设"), range(len(PRESETS)), index=None, key="preset", on_change=apply_preset,
                 format_func=lambda i: tr(PRESETS[i][0], PRESETS[i][1]),
                 placeholder=tr("Pick a classroom example", "选择一个课堂示例"))
    if "prompt" not in st.session_state:
        st.session_state.prompt = PRESETS[0][2]
    sb.text_area(tr("Prompt (Ctrl+Enter to run)", "提示词（Ctrl+Enter 运行）"), key="prompt", height=110)
    sb.number_input(tr("Token limit", "token 上限"), min_value=1, max_value=explorer.token_cap(),
                    value=min(explorer.DEFAULT_MAX_TOKENS, explorer.token_cap()), step=64, key="max_tokens")
    return st.session_state.get("prompt") or ""


def read_url_once() -> None:
    if st.session_state.get("_url_read"):
        return
    st.session_state._url_read = True
    for key in URL_KEYS:
        if key in st.query_params:
            st.session_state[key] = st.query_params[key]
    if st.session_state.get("lang") not in ("en", "zh"):
        st.session_state.lang = "en"
    if st.session_state.get("view") not in [v[0] for v in VIEWS]:
        st.session_state.view = VIEWS[0][0]


def write_url() -> None:
    wanted = {k: str(st.session_state[k]) for k in URL_KEYS if st.session_state.get(k) not in (None, "")}
    wanted["model"] = st.session_state.get("active_model", explorer.DEFAULT_SOURCE)
    if dict(st.query_params) != wanted:
        st.query_params.from_dict(wanted)


def main() -> None:
    read_url_once()
    st.sidebar.radio("Language / 语言", ["en", "zh"], key="lang", horizontal=True,
                     format_func=lambda v: "English" if v == "en" else "中文")
    st.sidebar.toggle(tr("Presenter mode (large fonts)", "演示模式（大字体）"), key="presenter")
    if st.session_state.get("presenter"):
        st.markdown("<style>html, .stMarkdown, p, li, label {font-size: 1.3rem !important;}</style>",
                    unsafe_allow_html=True)
    st.title(tr("🦙 LLaMA Explorer", "🦙 LLaMA 探索器"))

    facts = choose_model()
    prompt = sidebar_prompt()
    if facts is None:
        return
    cfg = facts.cfg
    if not prompt.strip():
        st.info(tr("Type a prompt in the sidebar, or pick a preset, to see what the model does with it.",
                   "在侧边栏输入提示词或选择预设，即可查看模型如何处理它。"))
        return
    ids, n_total = explorer.encode_prompt(st.session_state.active_model, prompt, int(st.session_state.max_tokens))
    if n_total > len(ids):
        st.warning(tr(f"The prompt has {n_total} tokens; only the first {len(ids)} are used (token limit).",
                      f"提示词共有 {n_total} 个 token，只使用前 {len(ids)} 个（token 上限）。"))
    if not ids:
        st.info(tr("The prompt produced no tokens.", "该提示词没有产生任何 token。"))
        return
    with st.spinner(tr("Running the model …", "正在运行模型 …")):
        rec = explorer.recording(st.session_state.active_model, tuple(ids))

    pieces = [display_piece(facts.piece(i)) for i in ids]
    sb = st.sidebar
    sb.divider()
    for key, hi in (("layer", cfg.n_layers - 1), ("head", cfg.n_heads - 1), ("token", len(ids) - 1)):
        clamp_state(key, hi)
    sb.slider(tr("Layer", "层"), 0, max(cfg.n_layers - 1, 1), key="layer", disabled=cfg.n_layers == 1)
    sb.slider(tr("Head", "头"), 0, max(cfg.n_heads - 1, 1), key="head", disabled=cfg.n_heads == 1,
              help=tr(f"Query head; heads {cfg.n_rep} at a time share one KV head",
                      f"查询头；每 {cfg.n_rep} 个头共享一个 KV 头"))
    sb.slider(tr("Token", "token"), 0, max(len(ids) - 1, 1), key="token", disabled=len(ids) == 1)
    layer = min(int(st.session_state.layer), cfg.n_layers - 1)
    head = min(int(st.session_state.head), cfg.n_heads - 1)
    token = min(int(st.session_state.token), len(ids) - 1)
    piece = plain(pieces[token])
    sb.caption(tr(f"Token {token} is “{piece}” (id {ids[token]}); head {head} reads KV head {head // cfg.n_rep}.",
                  f"第 {token} 个 token 是“{piece}”（id {ids[token]}）；头 {head} 读取 KV 头 {head // cfg.n_rep}。"))
    sb.download_button(tr("Download the recording (.npz)", "下载本次记录（.npz）"),
                       data=lambda: explorer.recording_npz(st.session_state.active_model, tuple(ids)),
                       file_name="recording.npz", mime="application/octet-stream", on_click="ignore")

    keys = [v[0] for v in VIEWS]
    view = st.segmented_control(tr("View", "视图"), keys, key="view", required=True,
                                format_func=lambda k: tr(*next(v[1:3] for v in VIEWS if v[0] == k)))
    view = view or keys[0]
    ctx = ViewContext(facts=facts, rec=rec, ids=ids, pieces=pieces, layer=layer, head=head, token=token,
                      lang=st.session_state.get("lang", "en"), presenter=bool(st.session_state.get("presenter")),
                      extras={"source": st.session_state.active_model})
    write_url()
    draw = next(v[3] for v in VIEWS if v[0] == view)
    try:
        draw(ctx)
    except Exception as e:  # a broken view must not take the page down; the log keeps the traceback
        log.exception("view %s failed", view)
        st.error(tr(f"This view failed: {plain(e)}", f"该视图出错：{plain(e)}"))
    finally:  # widgets and download buttons keep ctx for the whole session: let it hold only the cache key
        ctx.rec = explorer.RecordingRef(st.session_state.active_model, tuple(ids))


main()
