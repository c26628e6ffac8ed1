"""The gateway (app/gateway/__init__.py): one cache with one byte budget for every kind of result, one forward counter,
and lab experiments in one worker process that never touches the server's torch thread count."""
import threading
import time

import numpy as np
import pytest
from tolerance import EPS, ULPS, assert_close_recording
import torch

from apptest_util import run_app

from app import gateway
from app.gateway.state import LANE, SMALL_FORWARD_FLOPS
from explorer_model.analysis import measures as M
from explorer_model.lab import normlab as lab

pytestmark = pytest.mark.slow
PROMPT = "The cat sat on the mat. The cat sat"


def fresh_cache(monkeypatch, mb: float):
    """A new gateway cache whose budget comes from the environment, as `serve --cache-mb` sets it."""
    monkeypatch.setenv("LLAMA_EXPLORER_CACHE_MB", str(mb))
    gateway.result_cache.clear()  # the st.cache_resource singleton: the next call builds it from the env
    cache = gateway.result_cache()
    assert cache.budget == int(mb * 2**20) and cache.stored_bytes() == 0
    return cache


def unique_storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind tensors (the independent count for a Recording)."""
    seen = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def walk_views(lab_init: bool = True):
    """Residual (logit lens), What-if (changed run + KL) and, if asked, the lab's init experiment, via AppTest."""
    at = run_app(view="residual", prompt=PROMPT)
    assert not at.exception
    at.segmented_control(key="view").set_value("whatif").run()
    at.text_input(key="whatif_specs").set_value("no-mask").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    if lab_init:
        at.segmented_control(key="view").set_value("normlab").run()
        at.button(key="lab_init_run").click().run()
        assert not at.exception
    return at


def test_one_budget_holds_every_kind_and_counts_forwards(monkeypatch):
    cache = fresh_cache(monkeypatch, 4096)
    before = gateway.FORWARDS["count"]
    walk_views()
    kinds = cache.kinds()
    for kind in ("recording", "lens", "whatif", "whatif_kl", "lab_init"):
        assert kinds.get(kind, 0) > 0, (kind, kinds)
    # forwards: prompt recording + lens, changed run + its KL, the twins (2 prompts × 2 twins), one lab experiment
    assert gateway.FORWARDS["count"] - before == 2 + 2 + 4 + 1
    assert cache.stored_bytes() == sum(kinds.values()) <= cache.budget
    # a recording is counted by its distinct storages (resid_post of L is resid_pre of L+1: once)
    ids = tuple(gateway.encode_prompt("smollm2", PROMPT, 256)[0])
    rec = cache.peek(("recording", "smollm2", ids))
    tensors = [rec[n] for n in rec.names  # not what the recording rebuilds on access
               if "hook_pattern" not in n and "hook_attn_scores" not in n and n not in rec._rebuilt]
    tensors += [rec.logits, rec.token_ids]
    counted = cache._bytes[("recording", "smollm2", ids)]
    assert unique_storage_bytes(tensors) <= counted < unique_storage_bytes(tensors) + 2**20
    assert rec.stored_bytes() <= counted < rec.stored_bytes() + 2**20  # the recorder counts shared storage once too
    # the changed run holds rotated Q/K of every layer: they are counted too
    key = next(k for k in cache.keys() if k[0] == "whatif")
    run = cache.peek(key)
    assert counted_at_least(cache._bytes[key], [t for qk in run["rot"] for t in qk])
    # asking again costs no forward pass
    n = gateway.FORWARDS["count"]
    walk_views()
    assert gateway.FORWARDS["count"] == n


def counted_at_least(n: int, tensors) -> bool:
    return n >= unique_storage_bytes(tensors) > 0


def test_a_small_budget_evicts_and_stays_bounded(monkeypatch):
    cache = fresh_cache(monkeypatch, 3)  # 3 MiB: less than one SmolLM2 recording of this prompt
    walk_views(lab_init=False)
    assert cache.evictions > 0
    # evicted down to the budget (the recording, bigger than all of it, went), not down to one entry
    assert cache.stored_bytes() <= cache.budget and len(cache.keys()) > 1, (cache.stored_bytes(), cache.keys())
    n = gateway.FORWARDS["count"]
    at = run_app(view="residual", prompt=PROMPT)  # evicted: the recording and the lens are made again
    assert not at.exception and gateway.FORWARDS["count"] >= n + 1


def test_lab_experiments_queue_in_one_worker_and_never_touch_server_threads(monkeypatch):
    fresh_cache(monkeypatch, 512)
    restore = torch.get_num_threads()
    torch.set_num_threads(2)  # (this test process plays the server) two threads, so a worker's 1 would show
    server_threads = torch.get_num_threads()
    assert gateway.lab_worker_threads() == 1  # the worker has its own count
    seen, stop = set(), threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.add(torch.get_num_threads())
            time.sleep(0.005)
    poller = threading.Thread(target=poll)
    poller.start()
    configs = [lab.RaceConfig(depth=2, steps=12, log_every=4, seq=16, batch=4, seed=s) for s in (11, 12)]
    jobs = [gateway.lab_race(rc, None) for rc in configs]  # started at once
    positions = []
    while not jobs[1].done():
        positions.append(jobs[1].position())
        time.sleep(0.01)
    results = [j.result() for j in jobs]
    stop.set()
    poller.join()
    torch.set_num_threads(restore)
    assert seen == {server_threads} and server_threads == 2
    assert positions[0] == 1 and positions[-1] == 0 and positions == sorted(positions, reverse=True)
    assert jobs[0].done() and gateway.lab_queue_length() == 0
    with lab.threads(1):  # the same experiment in this process, one thread: the worker's results are these
        for rc, r in zip(configs, results):
            assert lab.race(rc)["curves"] == r["curves"]
    n = gateway.FORWARDS["count"]
    again = gateway.lab_race(configs[0], None)  # cached once finished: no second run
    assert again.done() and again.result()["curves"] == results[0]["curves"] and gateway.FORWARDS["count"] == n


def test_the_lab_view_shows_the_place_in_the_queue():
    """wait_for (the lab panel's waiting loop) tells a visitor how many experiments are ahead, then the progress."""
    from app.panels.normlab import wait_for

    class Job:  # a job two places back in the queue, then running, then done
        def __init__(self):
            self.states = [(2, 0.0, ""), (1, 0.0, ""), (0, 0.5, "half way"), (0, 1.0, "done")]
            self.fraction, self.message, self.partial = 0.0, "", None

        def position(self):
            return self.states[0][0]

        def done(self):
            return len(self.states) == 1

        def wait(self, on_update):
            while not self.done():
                _, self.fraction, self.message = self.states[0]
                on_update(self)
                self.states.pop(0)
            return {"ok": True}

    class Box:
        def __init__(self):
            self.shown = []

        def info(self, text):
            self.shown.append(("info", text))

        def progress(self, value, text):
            self.shown.append(("progress", value, text))

        def empty(self):
            self.shown.append(("empty",))

    box = Box()
    from app.i18n import translator
    assert wait_for(Job(), translator("en"), box) == {"ok": True}
    assert box.shown[0][0] == "info" and "2 experiment(s) ahead" in box.shown[0][1]
    assert box.shown[1][0] == "info" and "1 experiment(s) ahead" in box.shown[1][1]
    assert box.shown[2] == ("progress", 0.5, "half way") and box.shown[-1] == ("empty",)


def test_gateway_extend_reuses_the_cached_prefix_and_equals_a_fresh_recording(monkeypatch):
    """A generation step runs only the new position when the prompt's recording is cached, and what it stores
    under the longer prompt is, hook by hook, the recording of that prompt made from scratch."""
    from explorer_model.recording import record
    fresh_cache(monkeypatch, 4096)
    source = gateway.DEFAULT_SOURCE
    ids, _ = gateway.encode_prompt(source, PROMPT, 64)
    gateway.recording(source, ids)
    calls = []
    from app.gateway import costs as gateway_costs
    real = gateway_costs.extend_recording
    monkeypatch.setattr("app.gateway.costs.extend_recording",  # where the timed recording calls it
                        lambda *a, **kw: calls.append((a[2], kw["keep"])) or real(*a, **kw))
    grown = gateway.extend(source, ids, 42)
    assert calls == [([42], len(ids))]  # the one-position step, not a whole recording
    assert gateway.recording(source, list(ids) + [42]) is grown  # stored where the next page run looks
    # The SwiGLU view's prompt with one token replaced: the positions from the replaced one on run, no others.
    pos = len(ids) // 2
    changed = list(ids[:pos]) + [7] + list(ids[pos + 1:])
    replaced = gateway.recording(source, changed, base=ids)
    assert calls[1] == ([7] + list(ids[pos + 1:]), pos)
    for rec, prompt in ((grown, list(ids) + [42]), (replaced, changed)):
        fresh = record(gateway._model(source).model, prompt)
        assert_close_recording(rec, fresh)  # other row counts, other kernels: within float32 rounding
    fresh_cache(monkeypatch, 4096)
    calls.clear()
    gateway.extend(source, ids, 42)  # nothing cached: the longer prompt is recorded whole
    assert calls == []


def test_lens_of_a_generation_step_runs_one_position_and_equals_the_full_lens(monkeypatch):
    fresh_cache(monkeypatch, 4096)
    source = gateway.DEFAULT_SOURCE
    ids, _ = gateway.encode_prompt(source, PROMPT, 64)
    gateway.logit_lens(source, ids)
    rows = []
    real = M.lens_top
    monkeypatch.setattr(M, "lens_top", lambda m, x: rows.append(x.shape[1]) or real(m, x))
    gateway.extend(source, ids, 42)
    top, prob = gateway.logit_lens(source, list(ids) + [42])
    assert rows == [1]  # the new position only
    fresh_cache(monkeypatch, 4096)
    full_top, full_prob = gateway.logit_lens(source, list(ids) + [42])
    assert rows == [1, len(ids) + 1]
    assert np.array_equal(top, full_top)
    np.testing.assert_allclose(prob, full_prob, rtol=1e-4, atol=1e-6)  # pieces: other row counts


def test_a_served_process_prepares_the_lab_twins_once_in_the_background(monkeypatch):
    """A served process prepares in the background, once: the lab twins' held-out line, and the attention view's
    random-vector table for every model it has loaded."""
    from explorer_model.analysis.attention_math import textbook_table
    from explorer_model.lab.corpus import HELDOUT_LINE
    from explorer_model.cli.serve import server_env
    assert server_env()["LLAMA_EXPLORER_WARM_UP"] == "1"  # what `serve` starts has it; AppTest does not
    cache = fresh_cache(monkeypatch, 4096)
    head_dim = gateway.facts(gateway.DEFAULT_SOURCE).cfg.head_dim
    textbook_table.cache_clear()
    monkeypatch.setattr(gateway, "_WARM", {"started": False})
    monkeypatch.setenv("LLAMA_EXPLORER_WARM_UP", "1")
    gateway.warm_up()
    gateway.warm_up()  # once per process
    threads = [t for t in threading.enumerate() if t.name == "warm-up"]
    assert len(threads) == 1
    threads[0].join(60)
    for source in lab.TWINS:
        line = gateway._model(source).tokenizer.encode(HELDOUT_LINE, add_bos=True)
        assert cache.peek(("recording", gateway._ident(source), tuple(line))) is not None, source
    assert textbook_table.cache_info().currsize >= 1
    before = textbook_table.cache_info().hits
    textbook_table(head_dim)
    assert textbook_table.cache_info().hits == before + 1  # the default model's: ready before anyone asks


def test_the_lens_runs_beside_a_forward_pass_which_does_not_see_it(monkeypatch):
    """A view switch to the residual stream does not wait for the forward passes queued ahead of it: the lens runs
    while another thread holds the forward lock with a hook on the final norm attached (a recording or a what-if
    run in progress), and that hook does not fire for the lens, nor change it."""
    from app.gateway.state import _FORWARD
    fresh_cache(monkeypatch, 4096)
    source = gateway.DEFAULT_SOURCE
    ids, _ = gateway.encode_prompt(source, PROMPT, 64)
    gateway.recording(source, ids)
    model, fired = gateway._model(source).model, []
    holding, done = threading.Event(), threading.Event()

    def forward_in_progress():
        with _FORWARD, model.hooks([("ln_final.hook_scale", lambda x, hp: fired.append(x) or torch.ones_like(x))]):
            holding.set()
            done.wait(600)  # set once the lens is done or given up on
    other = threading.Thread(target=forward_in_progress)
    other.start()
    lens: dict = {}
    asker = threading.Thread(target=lambda: lens.setdefault("value", gateway.logit_lens(source, ids)))
    try:
        assert holding.wait(30)
        asker.start()
        asker.join(120)  # the lock is held until the lens is done: behind it, the lens would never be
        finished = not asker.is_alive()
    finally:
        done.set()
        other.join(30)
        asker.join(30)
    assert finished and fired == []
    top, prob = lens["value"]
    resid = torch.stack([gateway.recording(source, ids)[f"blocks.{l}.hook_resid_post"][0]
                         for l in range(model.cfg.n_layers)])
    expected = torch.softmax(model.unembed(model.ln_final(resid)), -1).max(-1)
    assert np.array_equal(top, expected.indices.numpy())
    np.testing.assert_allclose(prob, expected.values.numpy(), rtol=1e-4, atol=1e-6)


def test_a_wider_lens_runs_only_the_added_positions_and_equals_the_lens_at_once(monkeypatch):
    fresh_cache(monkeypatch, 4096)
    source = gateway.DEFAULT_SOURCE
    ids, _ = gateway.encode_prompt(source, PROMPT, 64)
    n = len(ids)
    rows = []
    real = M.lens_top
    monkeypatch.setattr(M, "lens_top", lambda m, x: rows.append(x.shape[1]) or real(m, x))
    narrow = gateway.logit_lens(source, ids, n - 4)
    wide = gateway.logit_lens(source, ids, n - 9)
    assert rows == [4, 5]  # the last 4 positions, then the 5 left of them
    assert narrow[0].shape[1] == 4 and wide[0].shape[1] == 9
    fresh_cache(monkeypatch, 4096)
    at_once = gateway.logit_lens(source, ids, n - 9)
    assert rows == [4, 5, 9]
    # the same top tokens, their probabilities within float32 rounding (the pieces and the whole are products of
    # other row counts, which a BLAS may give other kernels: tolerance.py)
    assert np.array_equal(wide[0], at_once[0])
    np.testing.assert_allclose(wide[1], at_once[1], rtol=0, atol=ULPS * EPS)


def test_a_small_models_recording_does_not_wait_behind_the_forward_lock(monkeypatch):
    """The twins' recordings (well under SMALL_FORWARD_FLOPS) run while another visitor's forward pass holds the
    lock, and equal the recording made alone; the default model's would wait (it is far above the bound)."""
    from explorer_model.memory import forward_flops
    fresh_cache(monkeypatch, 512)
    source = lab.TWINS[0]
    ids, _ = gateway.encode_prompt(source, "The quick brown fox", 64)
    assert forward_flops(gateway._model(source).model.cfg, len(ids)) < SMALL_FORWARD_FLOPS
    big = gateway._model(gateway.DEFAULT_SOURCE).model.cfg
    assert forward_flops(big, 16) > 4 * SMALL_FORWARD_FLOPS  # a short prompt on a big model
    held, done = threading.Event(), threading.Event()

    def hold():
        with gateway._FORWARD:
            held.set()
            done.wait(60)
    other = threading.Thread(target=hold)
    other.start()
    try:
        assert held.wait(30)
        rec = gateway.recording(source, ids)
        assert other.is_alive()  # it returned while the lock was still held
    finally:
        done.set()
        other.join()
    fresh_cache(monkeypatch, 512)
    alone = gateway.recording(source, ids)
    assert all(torch.equal(rec[n], alone[n]) for n in alone.names)


def test_view_data_is_computed_with_the_drawing_lane_given_up(monkeypatch):
    """gateway.derived (and compare mode's pair_derived) compute from cached recordings outside the drawing
    lane, so another visitor's page draws meanwhile; the page has the lane back when the data returns."""
    from test_lanes import lane_is_free
    fresh_cache(monkeypatch, 4096)
    source = gateway.DEFAULT_SOURCE
    ids, _ = gateway.encode_prompt(source, PROMPT, 64)
    gateway.recording(source, ids)
    seen = []

    def data(rec, layer):
        seen.append((lane_is_free(LANE), LANE.holding()))
        return rec.pattern(layer)[0, 0].numpy().copy()

    with LANE.held():
        first = gateway.derived("lane_probe", source, ids, data, 3)
        assert LANE.holding() and not lane_is_free(LANE)
        side = (source, ids, "")
        pair = gateway.pair_derived("lane_probe", (side, side), lambda a, b: seen.append(
            (lane_is_free(LANE), LANE.holding())) or 1)
        assert LANE.holding()
    assert seen == [(True, False), (True, False)] and pair == 1
    assert np.array_equal(first, gateway.recording(source, ids).pattern(3)[0, 0].numpy())


def test_a_shared_server_keeps_a_core_per_process_for_drawing_pages(monkeypatch):
    """serve --share: torch gets the cores left once each process keeps one for drawing pages (at least one
    thread); a local server, and a user's own OMP_NUM_THREADS, are left as they are."""
    from explorer_model.cli.serve import server_env, share_threads
    assert [share_threads(c) for c in (1, 2, 4, 16)] == [1, 1, 3, 15]
    assert [share_threads(c, 2) for c in (2, 4, 8)] == [1, 1, 3]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert server_env(share=True)["OMP_NUM_THREADS"] == "3" and "OMP_NUM_THREADS" not in server_env()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert server_env(share=True)["OMP_NUM_THREADS"] == "2"
