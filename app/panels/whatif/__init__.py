"""What if…: change one part of the model for one run and compare it with the unchanged run.

The unchanged run is the app's cached recording. The changed run, its KL and the head sweep are asked of the
gateway (app/gateway/__init__.py), which runs them under its forward lock and keeps them in its one byte-bounded cache. The interventions live in the URL (`whatif=no-mask,ablate:blocks.3.attn.head5`), so a link shows the
same experiment.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from app import choice_state, gateway, plots, sections
from app.context import ViewContext, plain
from app.i18n import error_text
from app.panels.whatif import bank as whatif_bank
from app.panels.generation import candidate_label
from app.sections import section
from app.panels.whatif.figs import (attention_figure, changed_name, distribution_data, distribution_figure,
                                     kl_figure, masked_blank, moved_figure, own_token_figure, pattern_of, sweep_figure)
from explorer_model import interventions as I
from explorer_model import view_choices as VC
from explorer_model.analysis import measures as M
from explorer_model.analysis import views_data as V

KL_MAX_POS = gateway.KL_MAX_POS
KINDS = {  # builder choices (in the order of explorer_model/view_choices.py) and the message that names each
    "ablate-head": "whatif.kind_ablate_head", "ablate-layer": "whatif.kind_ablate_layer",
    "skip-attn": "whatif.kind_skip_attn", "skip-mlp": "whatif.kind_skip_mlp", "no-mask": "whatif.kind_no_mask",
    "no-rope": "whatif.kind_no_rope", "norm-identity": "whatif.kind_norm_identity", "norm-eps": "whatif.kind_norm_eps",
    "scale": "whatif.kind_scale", "gate-off": "whatif.kind_gate_off", "relu": "whatif.kind_relu",
    "patch": "whatif.kind_patch"}
PATCH_HOOKS = list(VC.PATCH_HOOKS)


def candidate_namer(ctx: ViewContext):
    """id -> label of a next-token candidate after this prompt (generation.candidate_label)."""
    ids = [int(i) for i in ctx.ids]
    return lambda i: candidate_label(ctx.facts, ids, int(i))


# ----------------------------------------------------------------------------- choosing interventions
def _set_specs(text: str) -> None:
    st.session_state["whatif"] = text
    st.session_state["whatif_specs"] = text


def _typed() -> None:
    text = st.session_state.get("whatif_specs", "").strip()
    try:
        text = I.format_list(I.parse_list(text))
    except ValueError:
        pass  # kept as typed; the error is shown below the box
    _set_specs(text)


def _add(spec: str) -> None:
    current = st.session_state.get("whatif", "")
    specs = [s for s in current.split(",") if s.strip()]
    _set_specs(",".join(dict.fromkeys(specs + [spec])))


def built_spec(ctx: ViewContext, kind: str) -> str:
    """The string form the builder's widgets describe (layer and head from the sidebar selection)."""
    L, t, b = ctx.layer, ctx.t, f"blocks.{ctx.layer}"
    if kind in ("ablate-head", "ablate-layer"):
        choice_state.start("whatif_mean")
        mean = st.toggle(t("whatif.mean_over_positions_instead_of"), key="whatif_mean")
        return f"{'ablate-mean' if mean else 'ablate'}:{b}.attn" + (f".head{ctx.head}" if kind == "ablate-head" else "")
    if kind in ("skip-attn", "skip-mlp"):
        return f"skip:{b}.{kind[5:]}"
    if kind in ("no-mask", "no-rope", "gate-off", "relu"):
        choice_state.start("whatif_scope")
        every = st.radio(t("whatif.where"), VC.values("whatif_scope"), key="whatif_scope", horizontal=True,
                         format_func=lambda v: t("whatif.every_layer") if v else t("whatif.layer_only", l=L))
        return kind + ("" if every else f":{b}")
    if kind in ("norm-identity", "norm-eps"):
        choice_state.start("whatif_norm")
        norm = st.radio(t("whatif.which_norm"), VC.values("whatif_norm"), key="whatif_norm", horizontal=True,
                        format_func=lambda v: {"ln1": t("whatif.before_attention_ln1"),
                                               "ln2": t("whatif.before_the_ffn_ln2")}.get(v, t("whatif.final_norm")))
        target = norm if norm == "ln_final" else f"{b}.{norm}"
        if kind == "norm-identity":
            return f"norm-identity:{target}"
        choice_state.start("whatif_eps")
        eps = st.number_input("ε", min_value=0.0, format="%.1e", key="whatif_eps")
        return f"norm-eps:{target}={I.fmt_number(eps)}"
    if kind == "scale":
        choice_state.start("whatif_branch")
        choice_state.start("whatif_factor")
        branch = st.radio(t("whatif.branch"), VC.values("whatif_branch"), key="whatif_branch", horizontal=True,
                          format_func=lambda v: t("whatif.attention_output") if "attn" in v else t("whatif.ffn_output"))
        factor = st.number_input(t("whatif.factor"), step=0.1, key="whatif_factor")
        return f"scale:{b}.{branch}={I.fmt_number(factor)}"
    choice_state.start("whatif_patch_hook")
    choice_state.start("whatif_patch_pos", lo=-len(ctx.ids), hi=len(ctx.ids) - 1)
    hook = st.selectbox(t("whatif.activation"), PATCH_HOOKS, key="whatif_patch_hook")
    pos = st.number_input(t("whatif.position_negative_from_the_end"), -len(ctx.ids), len(ctx.ids) - 1,
                          key="whatif_patch_pos")
    return f"patch:{b}.{hook}@{int(pos)}"


def draw_chooser(ctx: ViewContext) -> tuple[list, str | None]:
    """The widgets; returns the parsed interventions (empty on error) and the source prompt's text."""
    t = ctx.t
    if "whatif_specs" not in st.session_state:  # a widget's state is dropped while another view is shown
        st.session_state["whatif_specs"] = st.session_state.get("whatif") or ""
    c = st.columns(5)
    c[0].button(t("whatif.no_causal_mask"), key="whatif_q_mask", on_click=_set_specs, args=("no-mask",))
    c[1].button(t("whatif.no_rope"), key="whatif_q_rope", on_click=_set_specs, args=("no-rope",))
    c[2].button(t("whatif.no_rope_no_mask"), key="whatif_q_both", on_click=_set_specs, args=("no-rope,no-mask",))
    c[3].button(t("whatif.bank_river_patch"), key="whatif_q_bank", on_click=whatif_bank.apply,
                args=(ctx.source, ctx.extras.get("replace_prompt")), disabled="replace_prompt" not in ctx.extras)
    c[4].button(t("whatif.clear"), key="whatif_clear", on_click=_set_specs, args=("",))
    left, right = st.columns([2, 3])
    with left:
        choice_state.start("whatif_kind")
        kind = st.selectbox(t("whatif.build_one"), list(KINDS), key="whatif_kind",
                            format_func=lambda k: t(KINDS[k]))
        spec = built_spec(ctx, kind)
        st.button(t("whatif.add", spec=spec), key="whatif_add", on_click=_add, args=(spec,))
        st.caption(t("whatif.layer_and_head_come_from_above" if ctx.presenter else "whatif.layer_and_head_come_from"))
    with right:
        st.text_input(t("whatif.interventions_comma_separated_also_in"),
                      key="whatif_specs", on_change=_typed, placeholder="no-mask, ablate:blocks.3.attn.head5")
        try:
            ivs = gateway.check_interventions(ctx.source, st.session_state.get("whatif", ""))
        except ValueError as e:
            st.error(plain(error_text(e, ctx.lang)))  # it quotes what was typed (or came in the link): never markdown
            return [], None
        source = None
        if I.needs_source(ivs):
            # The box shows the source the page runs with (whatif_source, which its link holds), set each time it
            # is drawn: hidden for a run (a spec that did not parse), it kept the value it was first given, and came
            # back with that while the link held the one typed. Without a source in the link, the other bank
            # sentence is the source (the same for whoever opens it).
            st.session_state["whatif_source_text"] = (st.session_state.get("whatif_source")
                                                      or whatif_bank.other_sentence(st.session_state.get("prompt")))
            st.text_input(t("whatif.source_prompt_activations_are_copied"),
                          key="whatif_source_text", on_change=lambda: st.session_state.update(
                              whatif_source=st.session_state.get("whatif_source_text", "")))
            source = st.session_state.get("whatif_source_text") or ""
    return ivs, source


# ----------------------------------------------------------------------------- drawing
def draw(ctx: ViewContext) -> None:
    st.subheader(ctx.t("whatif.title"))
    with section("whatif", "choose"):
        ivs, source_text = draw_chooser(ctx)
    with section("whatif", "results"):
        if ivs:
            draw_results(ctx, ivs, source_text)
    with plots.explainer(ctx, ctx.t("whatif.intro_expander"), expanded=not ivs):
        draw_intro(ctx)
    with section("whatif", "sweep"):
        draw_sweep(ctx)


def draw_intro(ctx: ViewContext) -> None:
    t = ctx.t
    st.markdown(t("whatif.switch_one_part_of_the"))
    st.latex(r"\mathcal{L}=-\frac{1}{T-1}\sum_{t=0}^{T-2}\log p(x_{t+1}\mid x_{\le t}),\qquad "
             r"\mathrm{KL}_l=\frac{1}{T}\sum_t\sum_v p_{l,t}(v)\log\frac{p_{l,t}(v)}{\tilde p_{l,t}(v)}")


def draw_results(ctx: ViewContext, ivs: list, source_text: str | None) -> None:
    t, source = ctx.t, ctx.source
    specs, ids = I.format_list(ivs), tuple(ctx.ids)
    source_ids: tuple[int, ...] = ()
    if source_text is not None:
        if not source_text.strip():
            st.warning(t("whatif.type_the_source_prompt_to"))
            return
        source_ids = tuple(gateway.encode_prompt(source, source_text, int(st.session_state.get(
            "max_tokens", gateway.DEFAULT_MAX_TOKENS)))[0])
    try:
        with st.spinner(t("whatif.running_the_changed_model")):
            run = gateway.whatif_run(source, ids, specs, source_ids)
            kl = gateway.whatif_kl(source, ids, specs, source_ids)
    except ValueError as e:  # e.g. a patch position beyond the source prompt, or a run too long for this server
        st.error(plain(error_text(e, ctx.lang)))
        return
    if source_text is None:
        st.subheader(t("whatif.with", plain_specs=plain(specs)))
    else:  # the prompt a patch copies from is part of the change
        st.subheader(t("whatif.with_source", plain_specs=plain(specs), source=plain(" ".join(source_text.split()))))
    changed = changed_name(t, specs, source_text)
    whatif_bank.draw_note(ctx, specs)
    loss0, loss1 = M.prompt_loss(ctx.rec.logits, ids), run["loss"]
    d = distribution_data(ctx.rec.logits[0, -1], run["last"])
    top0, top1 = int(ctx.rec.logits[0, -1].argmax()), int(run["last"].argmax())
    c = st.columns(4)
    c[0].metric(t("whatif.loss_on_the_prompt_unchanged"), f"{loss0:.3f}")
    moved = f"{loss1 - loss0:+.3f}"
    still = float(moved) == 0  # "+0.000": no arrow, no colour (a patch of the last position never moves it)
    c[1].metric(t("whatif.loss_on_the_prompt_changed"), f"{loss1:.3f}", "±0.000" if still else moved,
                delta_color="off" if still else "inverse", delta_arrow="off" if still else "auto")
    name = candidate_namer(ctx)
    # the changed run's top token, the unchanged one's under it: two tokens and an arrow overflow a quarter row; in
    # quotes, since a token such as "-" or "." alone reads as no value
    c[2].metric(t("whatif.top_next_token"), f"“{name(top1)}”",
                t("whatif.top_was", before=f"“{name(top0)}”") if top1 != top0 else t("whatif.top_kept"),
                delta_color="off", delta_arrow="off")
    c[3].metric(t("whatif.kl_at_the_output"), f"{kl[-1]:.4f}")
    left, right = st.columns([3, 2])
    with left:
        plots.show(lambda: distribution_figure(d, name, t, changed), ctx, key="whatif_dist",
                   height=max(420, plots.rows_height(len(d["ids"]))), share=0.6)
    with right:
        plots.show(lambda: moved_figure(d, name, t, changed), ctx, key="whatif_moved", height=420, share=0.4)
    plots.show(lambda: kl_figure(kl, t, changed), ctx, key="whatif_kl", height=340)
    start = max(0, len(ids) - KL_MAX_POS)
    st.caption(t("whatif.averaged_over_positions_a_layer", start=start, len_ids_1=len(ids) - 1))
    own0 = M.next_token_logprobs(ctx.rec.logits, ids).exp().numpy()
    own1 = run["own"]
    if len(ids) > 1:
        plots.show(partial(own_token_figure, own0, own1, ctx.labels, t, changed), ctx, key="whatif_own", height=360)
        if any(isinstance(iv, I.NoMask) for iv in ivs):
            others = [str(iv) for iv in ivs if not isinstance(iv, I.NoMask)]
            st.caption(" ".join(t(key, **values) for key, values in no_mask_lesson(loss0, loss1, own0, own1, others)))
    if any(isinstance(iv, (I.NoMask, I.NoRope)) for iv in ivs):
        draw_attention(ctx, ivs, run, specs, source_ids)

    def csv() -> str:
        rows = [("next", int(i), name(int(i)), float(a), float(b)) for i, a, b in zip(d["ids"], d["clean"], d["changed"])]
        rows += [("kl_layer", l, "", float(v), "") for l, v in enumerate(kl)]
        rows += [("own_next", p, ctx.pieces[p + 1], float(a), float(b)) for p, (a, b) in enumerate(zip(own0, own1))]
        rows += [("loss", "", "", loss0, loss1)]
        return plots.to_csv(["quantity", "id_or_position", "token", "unchanged", "changed"], rows)
    label = t("whatif.csv_runs")
    plots.csv_button(ctx, label, label, csv, "whatif.csv", key="whatif_csv")
    if not sections.unsent():  # the changed run whole (the sidebar's recording is the unchanged one)
        plots.npz_button(st, t("whatif.download_changed"), source, len(ids),
                         partial(gateway.changed_recording_npz, source, ids, specs, source_ids),
                         "recording_changed.npz", "whatif_npz", ctx.lang)


SAME_LOSS = 0.02  # of the loss: a change smaller than this (or than 0.05 nats) is no change to tell a class about


def no_mask_lesson(loss0: float, loss1: float, own0, own1, others=()) -> list[tuple[str, dict]]:
    """The no-mask caption's sentences (catalog key, values), read off this run: with the future in view a model may
    use it (the loss falls and p(own next token) rises), or, trained with the mask, be thrown by it (the loss rises),
    or on this prompt hardly notice (a random or tiny model: the loss barely moves), or gain at some positions and
    lose at others (the loss falls, the mean p does not rise). All happen, so the sentence says which one this run
    shows, first naming the `others` changes made with the mask (then not the mask's effect alone); probabilities
    keep two significant digits (a random model's 0.0002 is not 0.00)."""
    p0, p1 = float(np.mean(own0)), float(np.mean(own1))
    values = {"loss0": f"{loss0:.2f}", "loss1": f"{loss1:.2f}", "p0": f"{p0:.2g}", "p1": f"{p1:.2g}"}
    if abs(loss1 - loss0) < max(0.05, SAME_LOSS * abs(loss0)):
        key = "whatif.no_mask_loss_same"
    elif loss1 > loss0:
        key = "whatif.no_mask_loss_rises"
    else:
        key = "whatif.no_mask_loss_falls" if p1 > p0 and values["p1"] != values["p0"] else "whatif.no_mask_loss_mixed"
    both = [("whatif.no_mask_with_others", {"others": ", ".join(others)})] if others else []
    return both + [(key, values)]


def draw_attention(ctx: ViewContext, ivs: list, run: dict, specs: str, source_ids) -> None:
    t, L, H = ctx.t, ctx.layer, ctx.head
    mats = [masked_blank(ctx.rec.pattern(L)[0, H].double().numpy(), [], L),
            masked_blank(pattern_of(run, L, ivs)[H], ivs, L)]
    titles = [t("whatif.unchanged"), changed_name(t, specs)]  # the pair says what the change was, saved alone too
    label_sets = [ctx.labels, ctx.labels]
    rope_off = any(isinstance(iv, I.NoRope) and iv.layer is None for iv in ivs)
    if rope_off:
        perm = M.shuffle_keep_last(len(ctx.ids))
        shuffled = tuple(ctx.ids[i] for i in perm)
        shuf = gateway.whatif_run(ctx.source, shuffled, specs, source_ids)
        mats.append(masked_blank(pattern_of(shuf, L, ivs)[H], ivs, L))
        titles.append(t("whatif.changed_words_shuffled"))
        label_sets.append([f"{i}:{ctx.pieces[j]}" for i, j in enumerate(perm)])
    title = t("whatif.attention_of_layer_head", l=L, h=H)
    stacked = ctx.screen.stacked  # a phone: one under another
    plots.show(lambda: attention_figure(mats, titles, label_sets, t, stacked).update_layout(title=title), ctx,
               key="whatif_attn", height=min(700, 260 + 14 * len(ctx.ids)) * (len(mats) if stacked else 1))
    if rope_off:
        draw_shuffle(ctx, ivs, perm, shuffled, specs, source_ids)


def shuffle_rows(ctx: ViewContext, ivs: list, shuffled, specs: str, source_ids) -> list[tuple]:
    """(variant, prompt's last logits, shuffled prompt's last logits) for unchanged, changed, changed + no mask."""
    source, ids, run = ctx.source, tuple(ctx.ids), gateway.whatif_run
    rows = [(ctx.t("whatif.unchanged"), ctx.rec.logits[0, -1], gateway.recording(source, shuffled).logits[0, -1]),
            (specs, run(source, ids, specs, source_ids)["last"], run(source, shuffled, specs, source_ids)["last"])]
    if not any(isinstance(iv, I.NoMask) and iv.layer is None for iv in ivs):
        both = I.format_list(ivs + [I.NoMask()])
        rows.append((both, run(source, ids, both, source_ids)["last"], run(source, shuffled, both, source_ids)["last"]))
    return rows


def draw_shuffle(ctx: ViewContext, ivs: list, perm, shuffled, specs: str, source_ids) -> None:
    t, label_of = ctx.t, candidate_namer(ctx)
    st.markdown(t("whatif.same_words_another_order_the"))
    st.text(t("whatif.shuffled") + " ".join(ctx.pieces[i] for i in perm))  # prompt text: never markdown
    rows = shuffle_rows(ctx, ivs, shuffled, specs, source_ids)
    table = {t("whatif.model"): [], t("whatif.top_token_prompt"): [],
             t("whatif.top_token_shuffled"): [], t("whatif.max_logit"): []}
    def top(logits) -> str:
        i, p = V.top_token(logits)
        return f"{label_of(i)} {p:.3f}"
    for name, a, b in rows:
        for col, v in zip(table, (name, top(a), top(b), V.max_abs_diff(a, b))):
            table[col].append(v)
    plots.table(ctx, table)


def draw_sweep(ctx: ViewContext) -> None:
    t, cfg = ctx.t, ctx.cfg
    st.subheader(t("whatif.which_heads_matter_for_this"))
    st.markdown(t("whatif.ablate_every_head_in_turn"))
    c = st.columns([1, 1, 1, 1])
    choice_state.start("big_sweep_first", hi=cfg.n_layers - 1)  # a range of layers: at 32 × 32 heads a full sweep is long
    first = int(c[0].number_input(t("big.sweep_first"), 0, cfg.n_layers - 1, key="big_sweep_first"))
    choice_state.start("whatif_sweep_layers", cfg.n_layers - first, hi=cfg.n_layers - first)
    n = int(c[1].number_input(t("big.sweep_count", first=first), 1, cfg.n_layers - first, key="whatif_sweep_layers"))
    choice_state.start("whatif_sweep_mode")
    mean = c[2].radio(t("whatif.ablation"), VC.values("whatif_sweep_mode"), key="whatif_sweep_mode", horizontal=True,
                      format_func=lambda m: t("whatif.mean") if m else t("whatif.zero")) or False
    key = (ctx.source, tuple(ctx.ids), n, bool(mean), first)
    shown = choice_state.start("whatif_sweep_shown")  # a link's: the sweep was on the screen it was copied from
    if c[3].button(t("whatif.run_the_sweep"), key="whatif_sweep_run") or (
            shown and st.session_state.get("whatif_sweep_key") is None):
        bar = st.progress(0.0, text=t("whatif.ablating_heads"))
        gateway.head_sweep(*key[:4], first=first, progress=lambda d, total: bar.progress(
            d / total, text=t("whatif.block_of", d=d, total=total)))
        bar.empty()
        st.session_state["whatif_sweep_key"] = key
    res = gateway.cached_head_sweep(*key) if st.session_state.get("whatif_sweep_key") == key else None
    st.session_state["whatif_sweep_shown"] = res is not None
    if res is None:  # not asked for here yet, or evicted from the cache since
        st.caption(t("whatif.layers_heads_ablated_runs_batched", n=n, cfg_n_heads=cfg.n_heads, n_cfg_n_heads=n * cfg.n_heads))
        return
    delta = np.asarray(res["delta"])
    target = candidate_namer(ctx)(int(res["target"]))
    plots.show(lambda: sweep_figure(delta, res["layers"], target, res["p_clean"], t), ctx, key="whatif_sweep",
               height=min(900, 160 + 22 * len(res["layers"])))
    l, h = np.unravel_index(np.argmin(delta), delta.shape)
    st.caption(t("whatif.biggest_drop_layer_head_p", res_layers_l=res['layers'][l], h=h, delta_l_h=delta[l, h]))
    label = t("whatif.csv_sweep")
    plots.csv_button(ctx, label, label,
                     lambda: plots.matrix_csv(delta, [str(x) for x in res["layers"]], [str(x) for x in range(cfg.n_heads)],
                                              "layer\\head"), "whatif_sweep.csv", key="whatif_csv_sweep")
