"""What one visitor of a shared server can do to the others, and what the page shows them: every run passes one
cost check before it starts (memory and the forward lock's time bound), downloads are built on disk under a cap,
the lab's queue is bounded and forgets visitors who left, errors never name a server path, a "clear cache"
message from a browser leaves the room's caches alone, and CSV cells cannot run as spreadsheet formulas."""
from __future__ import annotations

import csv
import io
import os
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from apptest_util import all_text, forwards, run_app

from app import gateway, plots
from app.gateway import lab_jobs
from app.gateway.result_cache import ResultCache
from explorer_model import interventions as I

MODEL = "tiny-pre"
PROMPT = "The cat sat on the mat because it was warm"


@pytest.fixture
def ids():
    return tuple(gateway.encode_prompt(MODEL, PROMPT, 64)[0])


@pytest.fixture
def shared(monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
    gateway.result_cache.clear()  # rebuilt with the shared server's rules
    yield monkeypatch
    monkeypatch.delenv("LLAMA_EXPLORER_SHARE")
    monkeypatch.delenv("LLAMA_EXPLORER_CACHE_MB", raising=False)
    gateway.result_cache.clear()


# --------------------------------------------------------------------------- one cost check for every run
def test_a_what_if_list_collapses_repeats_and_is_bounded():
    assert I.parse_list(",".join(["no-mask"] * 2500)) == [I.NoMask()]
    assert len(I.parse_list("scale:blocks.0.hook_resid_post=2,scale:blocks.0.hook_resid_post=2")) == 2  # factors multiply
    with pytest.raises(I.TooMany):
        I.parse_list(",".join(f"scale:blocks.0.hook_resid_post={i}" for i in range(I.MAX_LIST + 1)))


@pytest.mark.parametrize("lang, lead", [("en", "Not run:"), ("zh", "未运行")])
def test_the_long_what_if_link_is_refused_in_one_line_before_anything_runs(lang, lead):
    cfg = gateway.facts(MODEL).cfg
    many = ",".join(f"scale:blocks.0.hook_resid_post={1 + i / 1e4}" for i in range(cfg.n_layers * cfg.n_heads + 5))
    gateway.recording(MODEL, gateway.encode_prompt(MODEL, PROMPT, 256)[0])  # A is cached: only B could run
    before = forwards()
    at = run_app(view="tokens", prompt=PROMPT, model=MODEL, lang=lang, cmp="whatif", cmp_iv=many)
    assert not at.exception
    refusals = [w.value for w in at.warning if lead in w.value]
    assert len(refusals) == 1 and "\n" not in refusals[0], [w.value for w in at.warning]
    assert forwards() == before


RUNS = {
    "recording": lambda ids: gateway.recording(MODEL, ids[:-1]),
    "compare B": lambda ids: gateway.changed_recording(MODEL, ids, "no-mask"),
    "what-if": lambda ids: gateway.whatif_run(MODEL, ids, "no-rope"),
    "what-if KL": lambda ids: gateway.whatif_kl(MODEL, ids, "skip:blocks.0.mlp"),
    "logit lens": lambda ids: gateway.logit_lens(MODEL, ids, 0),
    "head sweep": lambda ids: gateway.head_sweep(MODEL, ids, 1, False),
    "generation": lambda ids: gateway.continuation(MODEL, ids, 8),
}


@pytest.mark.parametrize("run", RUNS, ids=list(RUNS))
def test_every_run_is_refused_before_it_starts_when_it_would_hold_the_lock_too_long(run, ids, shared):
    gateway.recording(MODEL, ids)  # A, recorded while the bound allows it
    shared.setenv("LLAMA_EXPLORER_MAX_RUN_SECONDS", "1e-9")
    before = forwards()
    with pytest.raises(gateway.RunRefused) as e:
        RUNS[run](ids)
    assert forwards() == before and e.value.key == "run.too_long" and "\n" not in str(e.value)


def test_the_time_bound_is_twenty_seconds_on_a_shared_server_and_none_locally(monkeypatch):
    assert gateway.max_run_seconds() is None
    monkeypatch.setenv("LLAMA_EXPLORER_SHARE", "1")
    assert gateway.max_run_seconds() == 20.0
    monkeypatch.setenv("LLAMA_EXPLORER_MAX_RUN_SECONDS", "nan")
    assert gateway.max_run_seconds() is None


# --------------------------------------------------------------------------- compare mode's B and the budget
def test_compare_b_over_the_shared_budget_is_refused_before_running(ids, shared):
    need = gateway.prompt_cost(MODEL, ids)["recording"]
    shared.setenv("LLAMA_EXPLORER_CACHE_MB", str(need / 2 / 2**20))
    gateway.result_cache.clear()
    before = forwards()
    with pytest.raises(gateway.RunRefused) as e:
        gateway.changed_recording(MODEL, ids, "no-mask")
    assert e.value.key == "run.too_big" and forwards() == before
    assert gateway.stored_bytes() == 0


def test_a_shared_cache_never_stores_an_entry_larger_than_its_budget():
    cache = ResultCache(10_000, strict=True)
    big = cache.get(("big",), lambda: np.zeros(100_000, np.float32))
    assert big.shape == (100_000,) and cache.stored_bytes() == 0 and cache.peek(("big",)) is None


# --------------------------------------------------------------------------- .npz downloads
def test_an_npz_download_is_built_on_disk_and_leaves_no_file(ids):
    handle = gateway.recording_npz(MODEL, ids)
    assert not os.path.exists(handle.name)  # unlinked once open: nothing left behind
    arrays = np.load(handle)
    assert arrays["token_ids"].ravel().tolist() == list(ids) and "blocks.0.attn.hook_pattern" in arrays.files
    assert os.fstat(handle.fileno()).st_size == pytest.approx(gateway.npz_bytes(MODEL, len(ids)), rel=0.03)  # + zip headers
    assert "npz" not in gateway.result_cache().kinds()  # not kept in memory beside the recording


def test_an_npz_over_the_cap_is_refused_in_one_line_before_a_click(ids, monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_EXPORT_MB", str(gateway.npz_bytes(MODEL, len(ids)) / 2 / 2**20))
    with pytest.raises(gateway.RunRefused):
        gateway.recording_npz(MODEL, ids)
    at = run_app(view="tokens", prompt=PROMPT, model=MODEL, lang="zh")
    assert not at.exception
    assert not [b for b in at.get("download_button") if b.proto.id.endswith("download_npz")]  # no button to click
    assert "该下载约为" in all_text(at)  # the line that says why, in its place


# --------------------------------------------------------------------------- the lab's queue
@pytest.fixture
def fake_lab(monkeypatch):
    """The lab's queue over a thread that runs one job at a time, each waiting for `release`."""
    pool, release, who, gone = ThreadPoolExecutor(1), threading.Event(), {"id": None}, set()
    monkeypatch.setattr(lab_jobs, "_lab_pool", lambda: (pool, None))
    monkeypatch.setattr(lab_jobs, "visitor", lambda: who["id"])
    monkeypatch.setattr(lab_jobs, "session_alive", lambda sid: sid not in gone)
    monkeypatch.setitem(lab_jobs._LAB, "next", lab_jobs._LAB.get("next", 0))
    monkeypatch.setenv("LLAMA_EXPLORER_LAB_QUEUE", "3")

    def submit(visitor: str, name: str):
        who["id"] = visitor
        return lab_jobs._submit(("fake", name), lambda job_id: release.wait(30) and {"completed": False},
                                cache=False)
    yield types.SimpleNamespace(submit=submit, gone=gone)
    release.set()
    pool.shutdown(wait=True)
    lab_jobs._LAB_JOBS.clear()


def test_the_lab_queue_holds_one_experiment_per_visitor_and_a_room_cap(fake_lab):
    first = fake_lab.submit("a", "x")
    with pytest.raises(gateway.LabBusy) as e:
        fake_lab.submit("a", "y")  # a second experiment while the first waits
    assert e.value.key == "lab.one_each"
    assert fake_lab.submit("b", "x") is first  # joining the same experiment is free
    fake_lab.submit("c", "y")
    fake_lab.submit("d", "z")
    with pytest.raises(gateway.LabBusy) as e:
        fake_lab.submit("e", "w")
    assert e.value.key == "lab.queue_full" and gateway.lab_queue_length() == 3


def test_waiting_experiments_of_visitors_who_left_are_dropped(fake_lab, monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_LAB_QUEUE", "4")
    fake_lab.submit("a", "x")  # running
    waiting = [fake_lab.submit(v, v) for v in "bcd"]
    fake_lab.gone.update("bc")
    assert gateway.lab_queue_length() == 2  # a's and d's
    assert waiting[0].future.cancelled() and waiting[1].future.cancelled() and not waiting[2].future.cancelled()
    fake_lab.submit("e", "e")  # there is room again


# --------------------------------------------------------------------------- server paths
def test_share_mode_errors_name_the_model_never_a_server_path(tmp_path, shared):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "theta_inf.gguf").write_bytes(b"GGUF" + b"\xff" * 60)
    shared.setenv("LLAMA_EXPLORER_MODELS_DIR", str(folder))
    facts, err = gateway.try_load("theta_inf.gguf")
    assert facts is None and "theta_inf.gguf" in err and str(tmp_path) not in err and "/" not in err, err
    at = run_app(view="tokens", prompt=PROMPT, model="theta_inf.gguf")
    assert not at.exception
    text = all_text(at).replace("\\", "")  # the page escapes markdown characters (theta\\_inf)
    assert "Could not load theta_inf.gguf: theta_inf.gguf: truncated" in text and str(tmp_path) not in text


# --------------------------------------------------------------------------- Streamlit's clear-cache message
def test_a_visitors_clear_cache_message_keeps_the_rooms_caches(ids):
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.runtime.app_session import AppSession

    loaded, cache = gateway._model(MODEL), gateway.result_cache()
    rec = gateway.recording(MODEL, ids)
    session = types.SimpleNamespace(_session_state=types.SimpleNamespace(clear=lambda: None))
    session._handle_clear_cache_request = lambda: AppSession._handle_clear_cache_request(session)
    msg = BackMsg()
    msg.clear_cache = True
    AppSession.handle_backmsg(session, msg)  # what the server does with the message a browser sends
    assert gateway.result_cache() is cache and gateway._model(MODEL) is loaded
    before = forwards()
    assert gateway.recording(MODEL, ids) is rec and forwards() == before


# --------------------------------------------------------------------------- CSV formulas
def test_csv_text_cells_cannot_start_a_formula_and_numbers_stay_numbers():
    table = plots.to_csv(["piece", "value"], [["=HYPERLINK(\"x\")", -0.25], ["+1+1", 3], ["@SUM(A1)", "-1e-3"],
                                              ["-", 0], ["\tcmd", 1], ["\rcmd", 2], ["plain", -7]])
    rows = list(csv.reader(io.StringIO(plots.spreadsheet_safe(table))))
    assert [r[0] for r in rows[1:]] == ["'=HYPERLINK(\"x\")", "'+1+1", "'@SUM(A1)", "'-", "'\tcmd", "'\rcmd", "plain"]
    assert [r[1] for r in rows[1:]] == ["-0.25", "3", "-1e-3", "0", "1", "2", "-7"]


def test_every_csv_download_passes_the_neutraliser(monkeypatch):
    import pandas as pd

    sent = []
    monkeypatch.setattr(plots.st, "download_button", lambda label, data, **kw: sent.append(data))
    ctx = types.SimpleNamespace(lang="en")
    frame = pd.DataFrame({"piece": ["=1+2", "ok"], "id": [-3, 4]})
    plots.csv_button(ctx, "x", lambda: frame.to_csv(index=False), "a.csv", key="a")
    plots.csv_button(ctx, "x", plots.to_csv(["piece"], [["@x"]]), "b.csv", key="b")
    lazy, eager = sent
    assert list(csv.reader(io.StringIO(lazy())))[1:] == [["'=1+2", "-3"], ["ok", "4"]]
    assert list(csv.reader(io.StringIO(eager)))[1] == ["'@x"]


def test_the_metrics_endpoint_reports_the_result_caches_real_bytes():
    """/_stcore/metrics (Streamlit's StatsManager) reports the room's result cache per kind, with the bytes held."""
    import numpy as np
    from streamlit.runtime.stats import CACHE_MEMORY_FAMILY, StatsManager

    from app.gateway.result_cache import ResultCache
    from app.gateway.state import CacheMetrics

    cache = ResultCache(10 * 2**20)
    cache.put(("rec", "a"), np.zeros(1000, dtype=np.float32))
    cache.put(("rec", "b"), np.zeros(500, dtype=np.float32))
    cache.put(("lens", "a"), np.zeros(2000, dtype=np.float32))
    manager = StatsManager()
    manager.register_provider(CacheMetrics(cache))
    lines = {s.to_metric_str() for s in manager.get_stats([CACHE_MEMORY_FAMILY])[CACHE_MEMORY_FAMILY]}
    kinds = cache.kinds()
    assert (kinds["rec"], kinds["lens"]) == (6000, 8000)  # the arrays' own bytes, not a handle's
    assert lines == {f'cache_memory_bytes{{cache_type="llama_explorer_results",cache="{k}"}} {b}'
                     for k, b in kinds.items()}


def test_the_metrics_provider_does_not_keep_a_replaced_cache_alive():
    """Streamlit keeps a registered provider for the runtime's life; a result cache built anew must free the old
    one's recordings, not leave them to the metrics endpoint."""
    import gc
    import weakref

    import numpy as np
    from streamlit.runtime.stats import CACHE_MEMORY_FAMILY, StatsManager

    from app.gateway.result_cache import ResultCache
    from app.gateway.state import CacheMetrics

    cache = ResultCache(10 * 2**20)
    cache.put(("rec", "a"), np.zeros(1000, dtype=np.float32))
    manager = StatsManager()
    manager.register_provider(CacheMetrics(cache))
    gone = weakref.ref(cache)
    del cache
    gc.collect()
    assert gone() is None
    assert manager.get_stats([CACHE_MEMORY_FAMILY])[CACHE_MEMORY_FAMILY] == []
