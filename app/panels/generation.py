"""Residual & prediction view, the objective and the loop: the next-token loss at every position (what one training
step sees, all positions from one forward pass) beside step-by-step generation (one token per run: serial).

Generation keeps the prompt as token ids. The shell (app/main.py) owns that state and hands the panel two callables,
`ctx.extras["append_token"](token_id)` and `ctx.extras["undo"]()`; the panel asks the gateway to extend the current
recording by the chosen id (one KV-cache step) before appending, so the next run finds it cached. Without those
callables (an older shell) the panel falls back to the prompt text, and only offers tokens that end on a whole
character, so a split character never reaches the prompt box or the link.
"""
from __future__ import annotations

import logging
from functools import partial

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import choice_state, gateway, plots, token_window
from app.context import ViewContext, display_piece, plain
from explorer_model import view_choices as VC
from explorer_model.analysis import views_data as V
from explorer_model.analysis.objective import PositionLosses, position_losses
from explorer_model.tokenizer.labels import completion, fragment_labels, missing_bytes, readable

log = logging.getLogger("llama_explorer.generation")

N_DIST = 15
CONTINUE_MAX = 64  # tokens a "continue" click may add (~2 s of the one forward lock; others wait meanwhile), within
# the visitor's token limit and the model's context
STEP_KEYS = ("residual.step_raw", "residual.temperature", "residual.step_top_k", "residual.step_top_p")


# ----------------------------------------------------------------------------- pure data / figures
def loss_strip_figure(pl: PositionLosses, labels: list[str], t, lo: int = 0, hi: int | None = None,
                      pieces: list[str] | None = None) -> go.Figure:
    """One row: cell t = −ln p(token t+1 | tokens ≤ t), labelled by the position (labels) and showing the token it
    had to predict (pieces, without the position the axis already names: the text a cell has room for is the
    token's); the positions lo…hi-1 (all by default), coloured on the whole prompt's scale."""
    pieces = labels if pieces is None else pieces
    hi = len(pl.losses) if hi is None else hi
    fig = plots.heatmap(pl.losses[None, lo:hi], labels[lo:hi], [t("residual.loss_row")], colorscale="Reds", zmin=0.0,
                        zmax=float(pl.losses.max()), title=t("residual.loss_strip_title", mean=pl.mean, n=len(pl.losses)),
                        x_title=t("residual.loss_x"), y_title="", value_name=t("residual.loss_nats"), fmt=".3f")
    fig.update_traces(text=[pieces[lo + 1:hi + 1]], texttemplate="%{text}",
                      customdata=[np.stack([pl.target_prob[lo:hi], pl.target_rank[lo:hi]], -1)],
                      hovertemplate="%{x} → %{text}<br>" + t("residual.loss_nats") +
                                    " %{z:.3f}<br>p %{customdata[0]:.4f}, rank %{customdata[1]}<extra></extra>")
    fig.update_layout(meta={"id": "residual_loss_strip"})
    fig.update_yaxes(showticklabels=False)
    return fig


def steps_data(logits, temperature: float, top_k: int, top_p: float, n: int = N_DIST, seed: int = 0,
               n_ctx: int = 0) -> dict:
    """The n most likely tokens' probabilities after each filtering step, how many tokens survive each, and the
    token one reproducible draw picks (same prompt length n_ctx and seed, same draw)."""
    return V.sampling_steps(logits, temperature, top_k, top_p, n, seed, n_ctx)


def candidate_label(facts, ids: list[int], token_id: int, after=()) -> str:
    """A candidate token as a person reads it: a fragment of a character shows the character it would complete
    (after this prompt); a whole token shows its text. One that starts a character names it by the tokens `after`
    it, the model's own greedy continuation (gateway.continuation): X·1/2, the first of the two tokens X takes,
    when they finish it; else its bytes (‹E5 B0…›)."""
    prefix = [int(i) for i in ids[-4:]]  # a character is at most 4 bytes
    data = facts.token_bytes(int(token_id))
    done = completion(b"".join(facts.token_bytes(i) for i in prefix), data)
    if done:
        return f"→{done}"
    if after:
        named = fragment_labels([facts.token_bytes(i) for i in (*prefix, int(token_id), *after)])[len(prefix)]
        if "\u2039" not in named:  # the continuation finished the character (no bytes left unnamed)
            return display_piece(named)
    return display_piece(facts.piece(int(token_id)))


def starts_a_character(facts, ids: list[int], token_id: int) -> bool:
    """The candidate leaves a character unfinished that it did not complete: only the tokens after it name it."""
    return candidate_label(facts, ids, token_id).endswith("\u2026\u203a")


def steps_figure(data: dict, names: list[str], t) -> go.Figure:
    x = [f"{r}:{name}" for r, name in enumerate(names)]
    colours = ["#aaaaaa", "#1f77b4", "#2ca02c", "#d62728"]
    fig = go.Figure([go.Bar(x=x, y=data["probs"][s], customdata=data["ids"], marker_color=colours[s],
                            name=f"{t(STEP_KEYS[s])} ({data['survivors'][s]})",
                            hovertemplate="%{x} (id %{customdata})<br>p = %{y:.4f}<extra></extra>")
                     for s in range(4)])
    fig.update_layout(barmode="group", title=t("residual.next_token_probabilities_after_each"),
                      xaxis_title=t("residual.token_rank_text"), yaxis_title=t("residual.probability"),
                      margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.3),
                      meta={"id": "residual_steps"})
    fig.update_xaxes(type="category")
    return fig


# ----------------------------------------------------------------------------- the loop's state
def _text_fallback(facts, ids: list[int]):
    """append/undo through the prompt text, for a shell without the id callables (see the module docstring)."""
    def append(new: int) -> None:
        st.session_state.setdefault("pred_text_before", []).append(st.session_state.get("prompt", ""))
        base = ids[1:] if facts.add_bos and ids and ids[0] == facts.bos_id else ids
        st.session_state["prompt"] = facts.decode(list(base) + [int(new)])

    def undo() -> None:
        before = st.session_state.get("pred_text_before") or []
        if before:
            st.session_state["prompt"] = before.pop()
    return append, undo


def _step(source: str, ids: tuple, new: int, entry: dict, append) -> None:
    try:  # one KV-cache step; the next run reads it from the cache
        gateway.extend(source, ids, new)
    except Exception:  # it only saves a forward: the next run records the longer prompt whole (and says why not)
        log.exception("the step's KV-cache extension failed; the next run records the prompt whole")
    st.session_state.setdefault("pred_history", []).append(entry)
    append(new)


def _continue(source: str, ids: tuple, n: int, sampling: tuple, how: str, facts, append_many) -> None:
    """Up to n tokens at once, decoded without recording (gateway.continuation), appended as one step."""
    new = gateway.continuation(source, ids, n, *sampling)
    if not new:
        return
    # the text the tokens add, read as text: whole characters (a character split over tokens shown once), bytes
    # of one begun in the prompt or left unfinished as ‹E6 B7…›
    text = readable(b"".join(facts.token_bytes(int(i)) for i in new))
    st.session_state.setdefault("pred_history", []).append(
        {"ids": [*ids, *new], "id": new[0], "n": len(new), "how": how, "p_raw": None, "p_final": None,
         "label": text})
    append_many(new)


def probability(p: float | None) -> str:
    """A step's probability as the history table shows it; "–" for a continuation of several tokens, which has no
    one probability (an empty cell read "None")."""
    return "–" if p is None else f"{p:.4f}"


def _undo(undo) -> None:
    hist = st.session_state.get("pred_history") or []
    if hist:
        hist.pop()
    undo()


# ----------------------------------------------------------------------------- drawing
def draw_loss_strip(ctx: ViewContext) -> None:
    t = ctx.t
    if len(ctx.ids) < 2:
        st.info(t("residual.loss_needs_two_tokens"))
        return
    pl = position_losses(ctx.rec)
    n = len(pl.losses)
    fit = token_window.fitting(ctx, [], y_title=False,
                               min_cell=token_window.text_cell(ctx.pieces[1:], ctx.presenter))
    lo, hi = token_window.span("residual_loss_strip", n, fit, min(ctx.token, n - 1))
    plots.show(partial(loss_strip_figure, pl, ctx.labels, t, lo, hi, ctx.pieces), ctx, key="residual_loss_strip")
    token_window.controls(ctx, "residual_loss_strip", n, lo, hi)
    worst = int(np.argmax(pl.losses))
    # named as the strip shows it: the column of the position that guessed, the token it had to guess in its cell
    st.caption(t("residual.loss_caption", mean=pl.mean, n=len(pl.losses), at=ctx.labels[worst],
                 worst=ctx.pieces[worst + 1], worst_loss=float(pl.losses[worst]), hits=int((pl.target_rank == 0).sum())))
    plots.csv_button(ctx, t("residual.csv_losses"), t("residual.csv_losses"), lambda: plots.to_csv(
        ["position", "token", "next_token", "next_id", "loss_nats", "p_next", "rank_next", "top1_id"],
        ([p, ctx.pieces[p], ctx.pieces[p + 1], int(pl.targets[p]), float(pl.losses[p]), float(pl.target_prob[p]),
          int(pl.target_rank[p]), int(pl.predicted[p])] for p in range(len(pl.losses)))),
        "position_losses.csv", key="residual_csv_losses")


def draw_prediction(ctx: ViewContext) -> None:
    t, tok = ctx.t, ctx.facts
    st.subheader(t("residual.choosing_the_next_token"))
    c1, c2, c3, c4 = st.columns(4)
    for key in ("pred_temperature", "pred_top_p", "pred_seed"):
        choice_state.start(key)
    choice_state.start("pred_top_k", hi=ctx.cfg.vocab_size)
    temp = c1.slider(t("residual.temperature"), 0.0, 2.0, step=0.05, key="pred_temperature")
    top_k = int(c2.number_input(t("residual.top_k_0_off"), 0, ctx.cfg.vocab_size, key="pred_top_k"))
    top_p = c3.slider(t("residual.step_top_p"), 0.01, 1.0, step=0.01, key="pred_top_p")
    seed = int(c4.number_input(t("residual.sampling_seed"), 0, 2**31 - 1, key="pred_seed"))

    ids = [int(i) for i in ctx.ids]
    hist = st.session_state.get("pred_history") or []
    if hist and hist[-1]["ids"] != ids:
        hist.clear()  # the prompt was changed another way: this history no longer leads to it
    append, undo = ctx.extras.get("append_token"), ctx.extras.get("undo")
    by_ids = append is not None and undo is not None
    if not by_ids:
        append, undo = _text_fallback(tok, ids)

    data = steps_data(ctx.rec.logits[0, -1], temp, top_k, top_p, seed=seed, n_ctx=len(ids))
    # a candidate that starts a character is named by the character the model goes on to write (its greedy
    # continuation, a token per byte the character still lacks at most), worked out once per server
    after = {int(i): gateway.continuation(ctx.source, ids + [int(i)], missing_bytes(tok.token_bytes(int(i))))
             for i in data["ids"] if starts_a_character(tok, ids, int(i))}
    names = [candidate_label(tok, ids, int(i), after.get(int(i), ())) for i in data["ids"]]
    plots.show(lambda: steps_figure(data, names, t), ctx, key="residual_steps", height=440)
    s = data["survivors"]
    st.caption(t("residual.tokens_left", raw=s[0], tempered=s[1], top_k=s[2], top_p=s[3]))

    raw, final = data["raw"], data["final"]
    greedy, sampled = int(data["greedy"]), int(data["sampled"])

    def args(new: int, how: str) -> tuple:
        entry = {"ids": ids + [new], "id": new, "label": candidate_label(tok, ids, new), "how": how,
                 "p_raw": float(raw[new]), "p_final": float(final[new])}
        return ctx.source, tuple(ids), new, entry, append

    def blocked(new: int) -> bool:  # only the text fallback cannot hold half a character
        return not by_ids and "\ufffd" in tok.decode(ids + [new])

    b1, b2, b3 = st.columns(3)
    top = plain(candidate_label(tok, ids, greedy, after.get(greedy, ())))  # a button label is markdown
    b1.button(t("residual.take_the_top_token", top=top, p=float(raw[greedy])), key="pred_greedy", on_click=_step,
              args=args(greedy, "greedy"), disabled=blocked(greedy))
    b2.button(t("residual.sample_one"), key="pred_sample", on_click=_step, args=args(sampled, "sampled"),
              disabled=blocked(sampled))
    b3.button(t("residual.undo"), key="pred_undo", on_click=_undo, args=(undo,), disabled=not hist)
    if not by_ids and (blocked(greedy) or blocked(sampled)):
        st.caption(t("residual.fragment_needs_ids"))
    many = ctx.extras.get("append_tokens")
    room = min(CONTINUE_MAX, int(ctx.extras.get("token_limit", ctx.cfg.max_seq_len)) - len(ids))
    if by_ids and many is not None and room > 0:  # several tokens per click: decoded, not recorded
        c1, c2, c3 = st.columns(3)
        choice_state.start("pred_continue_n", min(VC.CHOICES["pred_continue_n"].default, room), hi=room)
        n = int(c1.number_input(t("residual.continue_n"), 1, room, key="pred_continue_n"))
        run_seed = seed * 7919 + len(ids)  # reproducible, and another draw after every step
        c2.button(t("residual.continue_top", n=n), key="pred_continue_greedy", on_click=_continue,
                  args=(ctx.source, tuple(ids), n, (0.0, 0, 1.0, 0), "greedy", tok, many))
        c3.button(t("residual.continue_sampled", n=n), key="pred_continue_sampled", on_click=_continue,
                  args=(ctx.source, tuple(ids), n, (temp, top_k, top_p, run_seed), "sampled", tok, many))
    if hist:
        def how(h: dict) -> str:
            kind = t("residual.top") if h["how"] == "greedy" else t("residual.sampled")
            return kind if "n" not in h else t("residual.continued", kind=kind, n=h["n"])
        plots.table(ctx, {t("residual.step"): list(range(1, len(hist) + 1)),
                          t("residual.token"): [h["label"] for h in hist],
                          t("residual.how"): [how(h) for h in hist],
                          t("residual.p_raw"): [probability(h["p_raw"]) for h in hist],
                          t("residual.p_after_filters"): [probability(h["p_final"]) for h in hist]})
    with plots.explainer(ctx, t("residual.how_sampling_works")):
        st.markdown(t("residual.temperature_divides_the_logits_before"))
        st.markdown(t("residual.serial_vs_parallel"))

    def csv() -> str:
        rows = ([r, int(i), names[r], *data["probs"][:, r].tolist()] for r, i in enumerate(data["ids"]))
        table = plots.to_csv(["rank", "id", "token", "raw", "tempered", "top_k", "top_p"], rows)
        return table + plots.to_csv(["survivors", "", "", *data["survivors"]], [])
    plots.csv_button(ctx, t("residual.csv_steps"), t("residual.csv_steps"), csv, "next_token_steps.csv",
                     key="residual_csv_steps")
