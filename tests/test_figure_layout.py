"""Figures sized for the width their column has (app/figure_layout.py, app/figure_text.py, app/screen.py), checked on
the figures themselves: every tick label gets the room its line needs, a phone's colour bar lies under the plot,
titles wrap short of Plotly's toolbar, and no font is smaller than the screen allows. The browser's rendering of the
same figures is measured in test_browser_layout.py."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from app import plots
from app.figure_spec import Figure, fitting_step, spec
from app.figure_layout import HEAT_MAX_H, LABEL_ROOM, PRESENTER_MAX_H, fit_figure, plot_area
from app.figure_text import (CHAR_EM, LINE, MIN_TEXT, PRESENTER_MIN_TEXT, TITLE_EM, TOOLBAR_H, Sizes, text_px,
                             title_pad, toolbar_px, wrap)
from app.screen import DESKTOP, PHONE, TABLET, Screen, from_cookie, from_report, guess

TOKENS = [f"{i}:{w}" for i, w in enumerate(
    "The animal didn't cross the street because it was too tired . And then it slept all day long".split())]
CHINESE = [f"{i}:{c}·{i % 3 + 1}/3" for i, c in enumerate("深度学习很有意思我们一起学习吧今天天气很好我们出去走走")]
WIDTHS = (358, 434, 736, 1120)


def fit(fig: go.Figure, width: float, **sizes) -> Figure:
    """The figure's spec, sized as the page sizes it (app/plots.finish without a page)."""
    done = Figure(spec(fig))
    fit_figure(done, width, **sizes)
    return done


def heat(labels: list[str], rows: list[str] | None = None) -> go.Figure:
    rows = labels if rows is None else rows
    return plots.heatmap(np.random.default_rng(0).random((len(rows), len(labels))), labels, rows,
                         title="Layer 0, head 0 (KV 0): probability", x_title="key", y_title="query")


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("presenter", [False, True])
@pytest.mark.parametrize("labels", [TOKENS, CHINESE], ids=["english", "chinese"])
def test_a_heatmap_fills_its_width_with_labels_that_never_overlap(width, presenter, labels):
    fig = heat(labels)
    fig = fit(fig, width, presenter=presenter, touch=False)
    lay = fig.layout
    assert lay.width is None and not lay.yaxis.scaleanchor  # as wide as its column
    assert lay.margin.autoexpand is False  # the cells are as wide as computed here
    plot_w = width - lay.margin.l - lay.margin.r
    plot_h = lay.height - lay.margin.t - lay.margin.b
    assert plot_w >= 0.55 * width and plot_h <= HEAT_MAX_H
    font = lay.xaxis.tickfont.size
    for axis, each in ((lay.xaxis, plot_w / len(labels)), (lay.yaxis, plot_h / len(labels))):
        step = labels.index(axis.tickvals[1]) - labels.index(axis.tickvals[0])
        assert list(axis.tickvals) == labels[::step]
        assert each * step >= LABEL_ROOM * font  # a label's line (its box: 1.33 font sizes) has room
    # rows as tall as the cells are wide, or as a label's line when every row's label fits; within the caps
    cell = plot_w / len(labels)
    row = max(cell, LABEL_ROOM * font) if len(labels) * LABEL_ROOM * font <= HEAT_MAX_H else cell
    cap = min(HEAT_MAX_H, PRESENTER_MAX_H - lay.margin.t - lay.margin.b) if presenter else HEAT_MAX_H
    assert plot_h == pytest.approx(min(len(labels) * row, cap), abs=2.5)  # margins are whole px
    assert font == (16 if presenter else 12)


@pytest.mark.parametrize("presenter", [False, True])
def test_a_heatmap_of_few_rows_is_as_tall_as_its_y_axis_title(presenter):
    """Three layers of a shallow model: the rotated y title ran out of the plot, into the figure's title."""
    title = "residual stream entering"
    fig = plots.heatmap(np.ones((3, 12)), TOKENS[:12], ["L0", "L1", "L2"], title="‖x‖₂ per layer and token",
                        x_title="token", y_title=title)
    lay = fit(fig, 1040, presenter=presenter, touch=False).layout
    font = lay.yaxis.title.font.size or lay.font.size or lay.yaxis.tickfont.size  # (the page's axis font)
    assert lay.height - lay.margin.t - lay.margin.b >= text_px(title, font)


def test_a_phone_heatmap_has_its_colour_bar_under_the_plot_and_a_desktop_one_beside_it():
    narrow, wide = heat(TOKENS), heat(TOKENS)
    narrow = fit(narrow, PHONE.main, presenter=False, touch=True)
    wide = fit(wide, DESKTOP.main, presenter=False, touch=False)
    assert narrow.data[0].colorbar.orientation == "h" and narrow.layout.margin.r < 20
    assert wide.data[0].colorbar.orientation == "v" and wide.layout.margin.r > 60
    assert narrow.layout.dragmode is False  # a finger on the figure scrolls the page
    assert wide.layout.dragmode is None


def test_a_one_row_strip_s_colour_bar_has_no_more_ticks_than_lines_fit_along_it():
    strip = plots.heatmap(np.random.default_rng(0).random((1, 14)) * 9, TOKENS[:14], ["loss"], title="loss per token")
    strip = fit(strip, DESKTOP.main, presenter=False, touch=False)
    lay, bar = strip.layout, strip.data[0].colorbar
    plot_h = lay.height - lay.margin.t - lay.margin.b
    assert bar.orientation == "v" and plot_h <= 80
    assert bar.nticks * MIN_TEXT * LABEL_ROOM <= plot_h  # each tick label's line has room along the bar


def test_cells_with_text_get_rows_for_it_and_margins_for_text_wider_than_a_cell():
    fig = heat(TOKENS[:6], ["loss"])
    fig.update_traces(text=[["␣because"] * 6], texttemplate="%{text}", textfont=dict(size=10))
    fig = fit(fig, PHONE.main, presenter=False, touch=True)
    tr, m = fig.data[0], fig.layout.margin
    assert tr.textfont.size == MIN_TEXT
    assert fig.layout.height - m.t - m.b >= 1.6 * MIN_TEXT
    cell = (PHONE.main - m.l - m.r) / 6
    spill = (text_px("␣because", MIN_TEXT) - cell) / 2
    assert min(m.l, m.r) >= spill  # the first and last cells' text stays inside the figure


def test_a_wrapped_title_s_lines_are_even_and_none_holds_a_lone_character():
    """Filled line by line, a title one character too wide left that character alone ("…低 = 集" / "中"); as few lines
    as before, each no wider than the room, as even as they can be."""
    for title in ("注意力熵（单位 nats）：低 = 集中", "各层中绝对值低于 0.1 的 FFN 神经元比例",
                  "Next-token probabilities at the last position"):
        room = text_px(title, 16) - 4  # a character short of one line
        lines = wrap(title, room, 16)
        assert len(lines) == 2 and all(text_px(line, 16) <= room for line in lines), lines
        assert min(text_px(line, 16) for line in lines) > 0.35 * max(text_px(line, 16) for line in lines), lines
    assert wrap("注意力熵（单位 nats）：低 = 集中", text_px("注意力熵（单位 nats）：低 = 集中", 16) - 4, 16) == [
        "注意力熵（单位 nats）：", "低 = 集中"]


def test_titles_wrap_short_of_the_toolbar_and_chinese_punctuation_stays_with_its_word():
    for touch in (False, True):
        fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]), layout=dict(
            title="Next-token probabilities at the last position, before and after the change", height=300))
        fig = fit(fig, PHONE.main, presenter=False, touch=touch)
        lines = fig.layout.title.text.split("<br>")
        assert len(lines) > 1 and fig.layout.title.yanchor == "top" and fig.layout.title.xanchor == "left"
        # the first line stands beside the toolbar, the others under it
        assert text_px(lines[0], 16, TITLE_EM) <= PHONE.main - toolbar_px(touch) - 16
        assert all(text_px(line, 16, TITLE_EM) <= PHONE.main - 16 for line in lines[1:])
        assert " ".join(lines) == "Next-token probabilities at the last position, before and after the change"
        narrow = wrap(" ".join(lines), PHONE.main - toolbar_px(touch) - 16, 16, TITLE_EM)
        if not touch:  # the desktop's toolbar is the wider: a line fewer than with every line beside it
            assert len(lines) < len(narrow), (lines, narrow)
        assert fig.layout.height > 300  # taller by the added lines
    assert wrap("位置从哪里进入：加到每个输入上（左），或只旋转 Q 和 K（右）", 272, 16) == [
        "位置从哪里进入：加到每个输入上", "（左），或只旋转 Q 和 K（右）"]
    # a short bracketed group is one name: never "(KV" on one line and "0)" on the next; a line may end before a
    # Chinese opening mark
    assert wrap("Layer 0, head 0 (KV 0): probability", 200, 16) == ["Layer 0, head 0", "(KV 0): probability"]
    assert wrap("头 0（KV 0）", 60, 12) == ["头 0", "（KV 0）"]
    # curly quotes are Chinese punctuation too: ”） never starts a line
    assert all(not line.startswith(("”", "）")) and not line.endswith("“") for w in range(60, 260, 2)
               for line in wrap("后面的 token 都把注意力给了“汇聚点”，也就是第一个 token", w, 16))
    assert wrap("head 0 (KV 0)", 80, 12) == ["head 0", "(KV 0)"]
    # a long one breaks as any text
    assert len(wrap("(a bracketed aside far longer than a name)", 120, 12)) > 1


@pytest.mark.parametrize("presenter", [False, True])
def test_no_font_is_smaller_than_the_screen_allows(presenter):
    least = PRESENTER_MIN_TEXT if presenter else MIN_TEXT
    fig = go.Figure([go.Heatmap(z=[[1, 2]], coloraxis="coloraxis", xaxis="x", yaxis="y"),
                     go.Heatmap(z=[[1, 2]], coloraxis="coloraxis2", xaxis="x2", yaxis="y2",
                                text=[["a", "b"]], texttemplate="%{text}", textfont=dict(size=10))],
                    layout=plots.grid_layout(1, 2, ["left", "right"]))
    fig.update_layout(xaxis_tickfont_size=9, legend_font_size=10, title=dict(text="t", font=dict(size=11)),
                      coloraxis=dict(colorbar=dict(title="A · B")), coloraxis2=dict(colorbar=dict(title="B − A")))
    fig.layout.annotations[0].font.size = 8
    fig = fit(fig, 800, presenter=presenter, touch=False, height=400)
    bars = [fig.layout.coloraxis.colorbar, fig.layout.coloraxis2.colorbar]
    sizes = [fig.layout.xaxis.tickfont.size, fig.layout.legend.font.size, fig.layout.title.font.size,
             fig.layout.annotations[0].font.size, fig.data[1].textfont.size,
             *(bar.tickfont.size for bar in bars), *(bar.title.font.size for bar in bars)]
    assert min(sizes) >= least


def test_a_bar_chart_of_many_categories_turns_and_thins_its_labels_for_a_phone():
    cats = [f"{i}:token{i}" for i in range(40)]
    fig = go.Figure(go.Bar(x=cats, y=np.arange(40.0)), layout=dict(height=380, margin=dict(l=10, r=10, t=50, b=10)))
    fig.add_vline(x=39, annotation_text="selected", annotation_position="top right")
    fig = fit(fig, PHONE.main, presenter=False, touch=True)
    axis = fig.layout.xaxis
    step = cats.index(axis.tickvals[1])
    assert axis.tickangle == -90 and list(axis.range) == [-0.5, 39.5]  # the categories span the axis
    assert plot_area(fig, PHONE.main, Sizes.for_screen(False))[0] / 40 * step >= LABEL_ROOM * 12
    few = go.Figure(go.Bar(x=["a", "b", "c"], y=[1, 2, 3]), layout=dict(height=300))
    few = fit(few, DESKTOP.main, presenter=False, touch=False)
    assert few.layout.xaxis.tickangle == 0 and list(few.layout.xaxis.tickvals) == ["a", "b", "c"]


def test_side_by_side_subplots_keep_room_for_the_right_one_s_axis_and_the_title_for_both_rows_of_titles():
    layout = plots.grid_layout(1, 2, ["added to the input: sizes per token", "RoPE in layer 0: what changes"],
                               hspace=0.1)
    layout["yaxis2"]["title"] = "relative change"
    layout.update(height=420, margin=dict(l=10, r=10, t=60, b=10),
                  title="Where position enters: added to every input (left) or turning only Q and K (right)")
    fig = go.Figure([go.Bar(x=TOKENS[:8], y=np.arange(8.0)), go.Bar(x=TOKENS[:8], y=np.arange(8.0) / 10,
                                                                   xaxis="x2", yaxis="y2")], layout=layout)
    fig = fit(fig, PHONE.main, presenter=False, touch=True)
    lay = fig.layout
    (a0, a1), (b0, b1) = lay.xaxis.domain, lay.xaxis2.domain
    assert a1 - a0 == pytest.approx(b1 - b0)  # as wide as each other
    plot_w = plot_area(fig, PHONE.main, Sizes.for_screen(False))[0]
    ticks = text_px("0.0000", 12)  # Plotly's labels of this axis are shorter
    assert (b0 - a1) * plot_w >= ticks + (12 + 2) * LINE  # the right plot's tick labels and axis title
    titles = [n for n in lay.annotations]
    assert [n.x for n in titles] == [pytest.approx((a0 + a1) / 2), pytest.approx((b0 + b1) / 2)]
    # the top margin: the title's lines (wrapped on a phone), then the subplot titles' lines under them
    n, sub = len(lay.title.text.split("<br>")), max(len(t.text.split("<br>")) for t in titles)
    assert n >= 3 and sub >= 2
    assert lay.margin.t >= title_pad(n, 16) + n * 16 * LINE + sub * 12 * LINE


def test_without_a_title_the_subplot_titles_stand_below_the_toolbar():
    """Two subplots titled and the figure not (compare mode's entropy and sink per layer): on a phone the right
    title's end ran under Plotly's buttons, which take the top TOOLBAR_H px of the figure's right corner."""
    layout = plots.grid_layout(1, 2, ["attention entropy (nats)", "weight on the first token (sink)"], hspace=0.1)
    layout.update(height=300, margin=dict(l=10, r=10, t=30, b=10))
    fig = go.Figure([go.Scatter(y=np.arange(6.0)), go.Scatter(y=np.arange(6.0), xaxis="x2", yaxis="y2")],
                    layout=layout)
    fig = fit(fig, PHONE.main, presenter=False, touch=True)
    lines = max(len(n.text.split("<br>")) for n in fig.layout.annotations)
    assert lines >= 2  # wrapped on a phone
    # the titles grow upwards from the plot's top: their top edge lies below the buttons' row
    assert fig.layout.margin.t - lines * 12 * LINE >= TOOLBAR_H


def test_rows_of_subplots_keep_room_for_the_titles_of_the_row_below():
    """Three rows of small multiples with titles that wrap on a phone: each gap between rows holds the lower row's
    title lines, the rows keep their heights, and the figure grows for it."""
    titles = [f"head {h} (KV {h // 3})" for h in range(9)]
    layout = plots.grid_layout(3, 3, titles, hspace=0.06, vspace=0.08)
    layout.update(height=500, margin=dict(l=90, r=10, t=70, b=90), title="every head")
    traces = [go.Heatmap(z=np.eye(4), x=TOKENS[:4], y=TOKENS[:4], xaxis=f"x{i + 1}".replace("x1", "x"),
                         yaxis=f"y{i + 1}".replace("y1", "y"), coloraxis="coloraxis") for i in range(9)]
    before = Figure(spec(go.Figure(traces, layout)))
    fig = fit(go.Figure(traces, layout), PHONE.main, presenter=False, touch=True)
    lay = fig.layout
    plot_h = lay.height - lay.margin.t - lay.margin.b
    rows = sorted({tuple(a.domain) for a in (lay.yaxis, lay.yaxis4, lay.yaxis7)}, key=lambda d: -d[1])
    old = sorted({tuple(a.domain) for a in (before.layout.yaxis, before.layout.yaxis4, before.layout.yaxis7)},
                 key=lambda d: -d[1])
    old_h = before.layout.height - before.layout.margin.t - before.layout.margin.b
    assert lay.height > before.layout.height
    for (b0, b1), (o0, o1) in zip(rows, old):
        assert (b1 - b0) * plot_h == pytest.approx((o1 - o0) * old_h, abs=1)  # each row as tall as before
    for above, row in zip(rows, rows[1:]):
        notes = [n for n in lay.annotations if n.y == pytest.approx(row[1])]
        lines = max(len(n.text.split("<br>")) for n in notes)
        assert len(notes) == 3 and lines >= 2  # the row's three titles, wrapped
        assert (above[0] - row[1]) * plot_h >= lines * 12 * LINE  # the gap holds them


def test_a_numeric_axis_gets_no_more_ticks_than_labels_fit():
    label = 5 * CHAR_EM * 16  # five characters at the projector's tick size
    fig = fit(go.Figure(go.Scatter(x=np.linspace(0, 1, 600), y=np.arange(600)), layout=dict(height=300)), 300,
              presenter=True, touch=False)
    ticks = np.arange(0, 1 + 1e-9, fig.layout.xaxis.dtick)  # from tick0 = 0, inside the data
    assert 2 <= len(ticks) and len(ticks) * (label + 24) <= plot_area(fig, 300, Sizes.for_screen(True))[0]
    fig = fit(go.Figure(go.Scatter(x=np.arange(600), y=np.arange(600)), layout=dict(height=300)), 300,
              presenter=True, touch=False)  # whole numbers: a whole step as long as the labels need
    assert 599 / fig.layout.xaxis.dtick * (label + 24) <= plot_area(fig, 300, Sizes.for_screen(True))[0]


@pytest.mark.parametrize("x", [list(range(7)), np.arange(7), np.arange(7, dtype=float)])
def test_an_axis_of_positions_has_ticks_at_whole_positions_only(x):
    """Compare mode's line over a prompt's seven positions: Plotly's own ticks, on a wide figure, went in steps of 0.5
    (positions 0.5, 1.5… that are no token)."""
    two = [go.Scatter(x=x, y=np.random.rand(7), name="A"), go.Scatter(x=x[:6], y=np.random.rand(6), name="B")]
    fig = fit(go.Figure(two, layout=dict(height=300)), 1400, presenter=False, touch=False)
    assert fig.layout.xaxis.tick0 == 0 and fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.nticks is None
    half = fit(go.Figure(go.Scatter(x=np.arange(7) / 2, y=np.arange(7)), layout=dict(height=300)), 1400,
               presenter=False, touch=False)
    assert half.layout.xaxis.dtick < 1  # halves: steps between the whole positions too


@pytest.mark.parametrize("reach, most, step", [
    ((-0.19, 0.12), 3, 0.1),  # What-if's Δp: Plotly's step 0.2 left one tick inside, "0"
    ((0.0, 0.27), 3, 0.1), ((0.0, 1.0), 5, 0.5), ((-0.06, 0.0), 1, 0.05), ((2.1, 2.3), 3, 0.1)])
def test_a_numeric_axis_gets_the_finest_step_whose_ticks_fit_inside_its_data(reach, most, step):
    assert fitting_step(*reach, most) == pytest.approx(step)
    fig = fit(go.Figure(go.Bar(x=[reach[0], reach[1]], y=["a", "b"], orientation="h"), layout=dict(height=300)), 300,
              presenter=False, touch=False)
    lo, hi = min(reach[0], 0), max(reach[1], 0)  # a bar from 0
    assert 2 <= np.floor(hi / fig.layout.xaxis.dtick + 1e-9) - np.ceil(lo / fig.layout.xaxis.dtick - 1e-9) + 1


@pytest.mark.parametrize("y, ticks", [
    ([0.021, 0.035, 0.048], [0.021, 0.028, 0.036, 0.048]),  # no 1, 2, 5 × 10^k inside: four spread evenly
    ([0.015, 0.06, 0.09], [0.015, 0.027, 0.05, 0.09]),  # two (0.02, 0.05) are too few: spread
    ([1.2, 4.0, 9.5], [1.2, 2.4, 4.8, 9.5]),
    ([0.011, 0.3, 0.95], [0.02, 0.05, 0.1, 0.2, 0.5]),  # one power of ten inside, and 1, 2, 5 steps enough
])
def test_a_log_axis_over_less_than_a_decade_gets_ticks_to_read_it_by(y, ticks):
    """Compare mode's residual sizes (RMS 0.02 … 0.05): Plotly labelled one tick of the log axis, or none."""
    fig = fit(go.Figure(go.Scatter(x=[0, 1, 2], y=y), layout=dict(height=300, yaxis_type="log")), 700,
              presenter=False, touch=False)
    assert fig.layout.yaxis.tickvals == ticks  # inside the data, at two significant digits: short labels
    wide = fit(go.Figure(go.Scatter(x=[0, 1], y=[0.003, 0.9]), layout=dict(height=300, yaxis_type="log")), 700,
               presenter=False, touch=False)
    assert wide.layout.yaxis.tickvals is None  # two powers of ten in the data: Plotly's decades read well


def test_the_screen_from_the_browser_or_a_guess():
    assert guess("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0) Mobile/15E148") == PHONE
    assert guess("Mozilla/5.0 (Linux; Android 14; SM-X710) AppleWebKit/537.36 Safari/537.36") == TABLET
    assert guess("Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0") == DESKTOP
    assert from_report({"main": 352, "window": 390, "touch": True}) == Screen(352, 390, True)
    for bad in (None, [], {"main": 352}, {"main": "wide", "window": 390, "touch": 1}, {"main": 5, "window": 390,
                                                                                      "touch": True}):
        assert from_report(bad) is None
    assert PHONE.stacked and PHONE.column(0.6) == PHONE.main  # Streamlit puts a phone's columns under each other
    assert not DESKTOP.stacked and DESKTOP.column(0.5) < DESKTOP.main / 2


def test_the_screen_cookie_is_read_only_when_it_is_one():
    """The browser's cookie (app/screen_probe.js writes it) is the browser's to send: anything else is no screen."""
    assert from_cookie("1040.1500.0") == Screen(1040, 1500, False)
    assert from_cookie("352.390.1") == Screen(352, 390, True)
    for bad in (None, "", "1040.1500", "1040.1500.2", "1040.1500.0.1", "-5.390.1", "5.390.1", "1e3.1500.0",
                "1040.1500.0" + "0" * 40, "１０４０.1500.0", "<b>1</b>.2.0"):
        assert from_cookie(bad) is None, bad


def test_the_axes_helper_lists_what_plotly_selects_in_the_same_order():
    """On the spec, as Plotly lists the graph objects' axes."""
    from plotly.subplots import make_subplots

    from app.figure_spec import axes

    fig = make_subplots(rows=3, cols=4)  # xaxis … xaxis12: a numeric order, not the keys' text order
    for r in range(3):
        for c in range(4):
            fig.add_trace(go.Heatmap(z=[[r, c]]), row=r + 1, col=c + 1)
    for letter, select in (("x", fig.select_xaxes), ("y", fig.select_yaxes)):
        assert [a.plotly_name for a in axes(Figure(spec(fig)), letter)] == [a.plotly_name for a in select()]
        assert len(axes(Figure(spec(fig)), letter)) == 12
    assert [a.plotly_name for a in axes(Figure(spec(go.Figure(go.Bar(y=[1])))), "x")] == ["xaxis"]


def test_a_spec_reads_and_updates_as_plotly_s_graph_objects_do():
    """What the sizing reads and writes on a spec (app/figure_spec.py) gives what Plotly's graph objects give: an
    unset property reads None, an unset object reads empty and appears in the spec only when written, updates merge
    objects, `title_standoff` names title.standoff, None removes."""
    graph = go.Figure(go.Heatmap(z=[[1, 2]], x=["a", "b"], y=["r"], colorbar=dict(title=dict(text="p"))))
    graph.update_layout(title="T", margin=dict(l=5))
    fig = Figure(spec(graph))
    assert fig.layout.title.text == graph.layout.title.text == "T"
    assert fig.layout.title.font.size is None and fig.layout.xaxis.tickfont.size is None
    assert fig.data[0].colorbar.title.text == "p" and fig.data[0].x == ["a", "b"]
    assert "xaxis" not in fig.spec["layout"] and fig.data[0].coloraxis is None
    fig.layout.xaxis.update(title_standoff=8, tickfont=dict(size=12))
    fig.layout.xaxis.update(tickfont=dict(color="red"))
    fig.update_layout(margin_t=30, width=None, title=dict(x=0))
    graph.layout.xaxis.update(title_standoff=8, tickfont=dict(size=12))
    graph.layout.xaxis.update(tickfont=dict(color="red"))
    graph.update_layout(margin_t=30, width=None, title=dict(x=0))
    assert fig.spec["layout"]["xaxis"] == graph.to_plotly_json()["layout"]["xaxis"] == {
        "title": {"standoff": 8}, "tickfont": {"size": 12, "color": "red"}}
    assert fig.spec["layout"]["margin"] == {"l": 5, "t": 30} and fig.spec["layout"]["title"] == {"text": "T", "x": 0}
    fig.layout.margin.update(l=None)
    assert fig.spec["layout"]["margin"] == {"t": 30}


def test_twenty_ranked_candidates_keep_every_name_on_a_phone():
    """What-if's and compare mode's next-token candidates (up to 20: both runs' top 10): a row each, so a phone names
    every one (side by side, twenty upright labels left room for every other one)."""
    from app.panels.compare.figs import bars_figure
    from app.panels.whatif.figs import distribution_figure
    from app.plots import rows_height

    names = [f"␣token{i}" for i in range(20)]
    p = np.linspace(0.3, 0.01, 20)
    whatif = distribution_figure({"ids": np.arange(20), "clean": p, "changed": p[::-1]}, lambda i: names[i],
                                 lambda key: key, "changed · no-mask")
    whatif.update_layout(height=rows_height(20))
    compare = bars_figure("compare_next", names, [("A", "A", p), ("B", "B", p[::-1])], title="next", y_title="p",
                          rows=True)
    for fig, labels in ((whatif, [f"{n} ({i})" for i, n in enumerate(names)]), (compare, names)):
        fitted = fit(fig, PHONE.main, presenter=False, touch=True)
        axis = fitted.layout.yaxis if fitted.data[0].orientation == "h" else fitted.layout.xaxis
        assert list(axis.tickvals) == labels, f"{fig.layout.title.text}: {len(axis.tickvals)} of 20 names shown"


def test_labels_between_side_by_side_subplots_are_cut_to_the_room_left_when_subplots_cannot_narrow():
    """Compare mode's A, B and B − A on a laptop: B − A's rows ("4:␣river→␣loan") stood over B's last cells, since
    making room would have left the subplots narrower than MIN_SUBPLOT; they get what room is left, and the
    labels are cut to it."""
    from app.figure_layout import MIN_SUBPLOT
    from app.figure_ticks import MIN_LABEL_CHARS

    a, b = ["0:The", "1:␣bank", "2:␣of", "3:␣the", "4:␣river"], ["0:The", "1:␣bank", "2:␣approved", "3:␣the", "4:␣loan"]
    diff = ["0:The", "1:␣bank", "2:␣of→␣approved", "3:␣the", "4:␣river→␣loan"]
    from app.panels.compare.figs import pair_heatmaps

    z = np.random.rand(5, 5)
    fig = fit(pair_heatmaps("compare_attention", [("A", "A", z, a, a), ("B", "B", z, b, b)], ("B − A", z - 0.5, diff, diff)),
              780, presenter=False, touch=False)
    plot_w = plot_area(fig, 780, Sizes.for_screen(False))[0]
    domains = [fig.layout.xaxis.domain, fig.layout.xaxis2.domain, fig.layout.xaxis3.domain]
    assert min(d[1] - d[0] for d in domains) >= MIN_SUBPLOT - 1e-9
    for (left, right), axis in zip(zip(domains, domains[1:]), (fig.layout.yaxis2, fig.layout.yaxis3)):
        widest = max(text_px(s, axis.tickfont.size or 12) for s in axis.ticktext)
        assert widest + 8 <= (right[0] - left[1]) * plot_w, f"{axis.ticktext} stand over the subplot to their left"
        assert all(len(s) >= MIN_LABEL_CHARS for s in axis.ticktext if s.endswith("…"))  # a position and some letters
