"""A page run that changes nothing builds nothing: every view's figures, tables and derived data come from the
gateway's cache the second time (app/gateway/figures.py, app/gateway/runs.py `derived`), which is what lets a
room of followers, each page rerun at every lecture step, share one computation per step."""
import pytest

from app import plots
from app.gateway.result_cache import ResultCache
from app.panels import VIEWS
from apptest_util import run_app

pytestmark = pytest.mark.app


def test_every_view_drawn_again_unchanged_builds_no_figure_table_or_view_data(monkeypatch):
    done = []  # what a page run computed: a cache entry, a finished figure, an Arrow table
    real_get, real_finish, real_arrow = ResultCache.get, plots.finish, plots.arrow_table

    def get(self, key, compute, lock=None):
        def counted():
            done.append(key[:2])
            return compute()
        return real_get(self, key, counted, lock)

    def finish(fig, *args, **kw):
        done.append(("figure finished", (fig.layout.meta or {}).get("id") if hasattr(fig, "layout") else fig))
        return real_finish(fig, *args, **kw)

    def arrow_table(data, *args):
        done.append(("table converted", list(data)[:2]))
        return real_arrow(data, *args)
    monkeypatch.setattr(ResultCache, "get", get)
    monkeypatch.setattr(plots, "finish", finish)
    monkeypatch.setattr(plots, "arrow_table", arrow_table)
    at = run_app(prompt="The capital of France is Paris, and the capital of Germany is")
    for view in [v[0] for v in VIEWS]:
        at.segmented_control(key="view").set_value(view).run()
        assert not at.exception, view
        first = len(done)
        at.run()
        assert first > 0 and done[first:] == [], (view, done[first:])
