"""The gateway's figure cache (app/gateway/figures.py through plots.show): a figure asked for again is not built
again, the browser receives exactly the spec of the figure built directly, and a figure is never served for a
selection, language, prompt or screen other than its own."""
import json
import logging
from dataclasses import dataclass

import numpy as np
import plotly.io
import plotly.tools
import pytest
from streamlit.elements.plotly_chart import _resolve_content_height

from app import gateway, plots
from app.gateway.figures import digest
from app.screen import DESKTOP, PHONE, Screen

logging.getLogger("streamlit").setLevel(logging.ERROR)  # bare mode: no page run around the calls


@dataclass
class Ctx:  # what plots.show and the digest read of a ViewContext
    layer: int = 0
    lang: str = "en"
    presenter: bool = False
    screen: Screen = DESKTOP

    def figure_digest(self):
        return (self.layer, self.lang, self.presenter)


@pytest.fixture
def sent(monkeypatch):
    """The spec each st.plotly_chart call would send, computed the way Streamlit does."""
    specs = []

    def chart(fig, **kw):
        figure = plotly.tools.return_figure_from_figure_or_data(fig, True)
        specs.append(plotly.io.to_json(figure, validate=False))
        # the frame Streamlit gives the chart is as tall as the figure's layout says
        assert _resolve_content_height("content", figure) == json.loads(specs[-1])["layout"]["height"]
    monkeypatch.setattr(plots.st, "plotly_chart", chart)
    gateway.result_cache().discard("figure")
    gateway.result_cache().discard("figure_spec")
    return specs


BUILDS = []  # a global, not a closed-over value: counting must not change what names the figure


def draw(ctx, z, builds):
    def figure():
        BUILDS.append(1)
        return plots.heatmap(z, [f"x{i}" for i in range(z.shape[1])], ["a", "b"], title=f"layer {ctx.layer}")
    builds.append(len(BUILDS))
    plots.show(figure, ctx, key="test_heat", height=400)
    builds[-1] = len(BUILDS) - builds[-1]  # 1 when this call built the figure, 0 when it came from the cache


def test_a_figure_asked_for_again_is_not_built_again_and_is_sent_unchanged(sent):
    z, builds = np.arange(6.0).reshape(2, 3), []
    draw(Ctx(), z, builds)
    draw(Ctx(), z.copy(), builds)  # equal values, another array: the same figure
    assert builds == [1, 0] and len(sent) == 2 and sent[0] == sent[1]
    direct = plots.heatmap(z, ["x0", "x1", "x2"], ["a", "b"], title="layer 0")
    plots.show(direct, Ctx(), key="test_heat", height=400)
    assert sent[2] == sent[0]  # what the browser receives is the figure's own spec
    assert any(k[0] == "figure" for k in gateway.result_cache().keys())


@pytest.mark.parametrize("change", [dict(layer=1), dict(lang="zh"), dict(presenter=True), dict(screen=PHONE),
                                    dict(screen=Screen(main=DESKTOP.main - 8)),
                                    dict(screen=Screen(touch=True))])
def test_another_selection_language_presenter_mode_or_screen_gets_its_own_figure(sent, change):
    """Another selection, language or presenter mode (a build that reads ctx may read it) is another figure, built
    again; another screen is the same figure finished for it: built once, and sent as the figure built for that
    screen directly would be."""
    z, builds = np.arange(6.0).reshape(2, 3), []
    draw(Ctx(), z, builds)
    draw(Ctx(**change), z, builds)
    assert builds == ([1, 0] if "screen" in change else [1, 1])  # this build reads ctx: its presenter flag too
    plots.show(plots.heatmap(z, ["x0", "x1", "x2"], ["a", "b"], title=f"layer {change.get('layer', 0)}"),
               Ctx(**change), key="test_heat", height=400)
    assert sent[2] == sent[1]  # what the other screen receives is the figure finished for it directly


def test_other_data_gets_its_own_figure(sent):
    builds = []
    draw(Ctx(), np.zeros((2, 3)), builds)
    draw(Ctx(), np.ones((2, 3)), builds)
    assert builds == [1, 1] and sent[0] != sent[1]


def test_a_closure_the_digest_cannot_name_is_built_every_time(sent):
    thing, builds = object(), []
    assert digest(lambda: thing) is None

    def figure():
        builds.append(thing)
        return plots.heatmap(np.zeros((2, 2)), ["a", "b"], ["a", "b"])
    for _ in range(2):
        plots.show(figure, Ctx(), key="test_plain")
    assert len(builds) == 2 and sent[0] == sent[1]


def test_a_figure_named_in_the_visitor_s_language_is_one_figure_for_every_selection_and_one_per_language(sent):
    """A build that closes over ctx.t (the catalog in the visitor's language) is named by the language alone: a
    model-only figure is not built again for another prompt, layer or token, and is for another language."""
    from types import SimpleNamespace

    from app.context import ViewContext
    facts = SimpleNamespace(source="m")

    def ctx(lang="en", **sel):
        return ViewContext(facts=facts, rec=None, ids=sel.pop("ids", [1, 2]), pieces=["a", "b"],
                           **dict(dict(layer=0, head=0, token=0), **sel), lang=lang)
    start = len(BUILDS)

    def draw_named(c):
        t = c.t

        def figure():
            BUILDS.append(t("app.title"))
            return plots.heatmap(np.zeros((2, 2)), ["a", "b"], ["a", "b"], title=t("view.tokens"))
        plots.show(figure, c, key="test_named")
    for c in [ctx(), ctx(layer=3), ctx(ids=[5, 6, 7], token=2), ctx("zh"), ctx("zh", head=1)]:
        draw_named(c)
    assert BUILDS[start:] == [ctx().t("app.title"), ctx("zh").t("app.title")]
    assert json.loads(sent[0])["layout"]["title"]["text"] != json.loads(sent[3])["layout"]["title"]["text"]
    assert digest(ctx(layer=1).figure_digest) != digest(ctx(layer=2).figure_digest)  # other methods: the selection


def labelled_heatmap(labels, t):
    BUILDS.append(1)
    return plots.heatmap(np.zeros((1, len(labels))), labels, ["a"], title=t("app.title"))


def test_a_partial_is_named_by_the_values_it_was_given(sent):
    """partial(build, ctx.labels, ctx.t) takes the labels when it is made: another layer, head or token of the same
    prompt is the same figure; other labels are another."""
    from functools import partial
    from types import SimpleNamespace

    from app.context import ViewContext
    facts = SimpleNamespace(source="m")

    def ctx(pieces=("a", "b"), **sel):
        return ViewContext(facts=facts, rec=None, ids=[1] * len(pieces), pieces=list(pieces),
                           **dict(dict(layer=0, head=0, token=0), **sel))
    start = len(BUILDS)
    for c in [ctx(), ctx(layer=2, head=1, token=1), ctx(pieces=("a", "c"))]:
        plots.show(partial(labelled_heatmap, c.labels, c.t), c, key="test_partial")
    assert len(BUILDS) - start == 2
    assert json.loads(sent[0])["data"][0]["x"] == ["0:a", "1:b"] and json.loads(sent[2])["data"][0]["x"] == ["0:a", "1:c"]


def test_a_table_is_named_by_its_values_and_sent_as_streamlit_converts_it(monkeypatch):
    """plots.table: the same values (a dict or a DataFrame, another object) are one Arrow table, converted once;
    other values, another index or presenter mode (numbers written in their formats, headers renamed) another."""
    import pandas as pd
    from streamlit.dataframe_util import convert_pandas_df_to_arrow_table

    sent, converted = [], []
    monkeypatch.setattr(plots.st, "dataframe", lambda data, **kw: sent.append(data))
    monkeypatch.setattr(plots.st, "table", lambda data, **kw: sent.append(data))
    real = plots.arrow_table
    monkeypatch.setattr(plots, "arrow_table", lambda *a: converted.append(1) or real(*a))
    gateway.result_cache().discard("table")
    values = {"x": [1, 2, 3], "p": [0.5, 0.25, 0.125]}
    for data in (values, {k: list(v) for k, v in values.items()}, pd.DataFrame(values), pd.DataFrame(values)):
        plots.table(Ctx(), data)
    assert len(converted) == 2 and len(sent) == 4  # the dict once, the DataFrame once
    assert all(s.equals(convert_pandas_df_to_arrow_table(pd.DataFrame(values))) for s in sent)
    plots.table(Ctx(), pd.DataFrame(values, index=[3, 4, 5]))
    plots.table(Ctx(), {"x": [1, 2, 4], "p": values["p"]})
    plots.table(Ctx(presenter=True), values, labels={"p": "prob"}, formats={"p": "%.2f"})
    assert len(converted) == 5
    assert sent[-1].column_names == ["x", "prob"] and sent[-1].column("prob").to_pylist() == ["0.50", "0.25", "0.12"]


def test_a_curve_is_named_by_its_values_and_their_kind():
    """A long list of floats is digested as one array: equal values name one figure, another value or another
    kind of number (int, bool) or container another."""
    curve = [0.1 * i for i in range(20)]
    names = [digest(lambda: c) for c in (curve, list(curve), curve[:-1] + [9.0], tuple(curve),
                                          [float(i) for i in range(20)], list(range(20)), [bool(i % 2) for i in range(20)])]
    assert names[0] == names[1] and len(set(names[1:])) == 6


def test_two_lambdas_of_one_function_over_the_same_values_are_two_figures():
    """Their qualified names are the same (`f.<locals>.<lambda>`): the line they stand on tells them apart."""
    values = [1.0, 2.0]
    first = lambda: values  # noqa: E731
    second = lambda: values  # noqa: E731
    assert first.__qualname__ == second.__qualname__ and digest(first) != digest(second)
