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
    z, builds = np.arange(6.0).reshape(2, 3), []
    draw(Ctx(), z, builds)
    draw(Ctx(**change), z, builds)
    assert builds == [1, 1]


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
