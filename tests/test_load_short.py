"""Many visitors at once: the short load run (bench/bench_load.py with 5 visitors) and the isolation it relies on."""
import importlib.util
import sys
import threading
from pathlib import Path

import pytest
import torch

from explorer_model import LlamaModel, ModelConfig
from explorer_model.recording import record

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_load.py"


def tiny_model() -> LlamaModel:
    cfg = ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=8, d_ff=80,
                      norm_eps=1e-5, rope_theta=10000.0, max_seq_len=64, tie_embeddings=False)
    torch.manual_seed(0)
    return LlamaModel(cfg).eval().requires_grad_(False)


def test_a_panel_using_the_model_does_not_leak_into_another_visitors_recording():
    """The residual view runs model.ln_final on a [pos, d_model] slice (the logit lens) while another
    visitor's forward pass may be recording; the recording must keep its own [1, pos, 1] divisor."""
    model, tokens = tiny_model(), [3, 14, 15, 92, 65, 35]
    clean = record(model, tokens)
    inside, lens_done, out = threading.Event(), threading.Event(), {}

    def pause(x, hp):  # the last hook of the forward: ln_final has been recorded, the hooks are still on
        inside.set()
        lens_done.wait(10)

    def visitor_a():
        with model.hooks([("logits", pause)]):
            out["rec"] = record(model, tokens)

    a = threading.Thread(target=visitor_a)
    a.start()
    assert inside.wait(10)
    with torch.no_grad():
        model.ln_final(torch.randn(4, 48))  # visitor B's logit lens, while A's recorder is attached
    lens_done.set()
    a.join(10)
    rec = out["rec"]
    assert rec["ln_final.hook_scale"].shape == (1, len(tokens), 1)
    for name in ("ln_final.hook_scale", "ln_final.hook_normalized", "logits"):
        assert torch.equal(rec[name], clean[name]), name


def test_concurrent_recordings_each_get_every_tensor():
    """Visitors' forward passes attach and remove hooks at the same time: none may be lost or left behind."""
    model, tokens = tiny_model(), [3, 14, 15, 92, 65, 35]
    clean = record(model, tokens)
    failures = []

    def visitor():
        try:
            for _ in range(15):
                rec = record(model, tokens)
                for name in clean.names:
                    if not torch.equal(rec[name], clean[name]):
                        failures.append(name)
        except Exception as e:  # a lost hook shows up as a KeyError for its name
            failures.append(repr(e))

    threads = [threading.Thread(target=visitor) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so an unguarded read-modify-write would be caught
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not failures, failures[:5]
    assert not any(hp.fns for hp in model.hook_dict.values())


def test_hooks_of_another_thread_do_not_change_this_threads_path():
    model, tokens = tiny_model(), torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        ref = model(tokens)
    attached, release = threading.Event(), threading.Event()

    def other():  # e.g. a what-if run that hooks attention patterns
        with model.hooks([("blocks.0.attn.hook_pattern", lambda x, hp: x * 0)]):
            attached.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert attached.wait(10)
    try:
        assert not model.blocks[0].attn.hook_pattern.active
        with torch.no_grad():
            assert torch.equal(model(tokens), ref)
    finally:
        release.set()
        t.join(10)
    assert not any(hp.fns for hp in model.hook_dict.values())


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_load", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.kernels
def test_same_prompt_is_bit_identical_across_threads_cache_and_processes(bench):
    from app import gateway

    report = bench.determinism(gateway._model("smollm2"), "The bank near the river collapsed.", threads=3)
    assert report["identical"], report
    assert report["cache_recomputed"] > 1  # the cache really recomputed the same prompt
    assert len(report["digests"]) == 3


@pytest.mark.slow
def test_five_visitors_no_errors_memory_bounded(bench):
    # four ordinary visitors and an adversarial one (a what-if link of 2,500 changes, a long prompt against its
    # no-mask twin, the .npz download, the lab button pressed again and again): each of its asks is answered or
    # refused in one line, and nobody sees an error (without the bench's quiet visitor, which only measures CPU)
    args = bench.parse_args(["--visitors", "5", "--adversaries", "1", "--prompts", "1", "--think", "0.3", "--ramp",
                             "2", "--timeout", "60", "--max-seconds", "150", "--cache-mb", "256", "--no-determinism",
                             "--quiet-prompts", "0"])
    report = bench.run(args)
    assert report["errors"] == 0, report["error_examples"]
    assert report["server_log_tracebacks"] == 0
    assert report["actions"] == 4 * (1 + 6 * 1)
    answers = report["adversaries"]["answers"]
    assert answers["adv_long_whatif refused"] == 1, answers  # more changes than the model has heads
    assert answers["adv_download refused"] == 1, answers  # a long prompt's .npz is over this server's 128 MB cap
    assert set(report["adversaries"]["latency_s"]) == {"adv_long_whatif", "adv_huge_b", "adv_lab_flood"}
    mem = report["memory_mb"]
    assert 0 < mem["peak"] < mem["bound"], mem
    assert set(report["latency_s"]) >= {"open", "new_prompt", "switch_view", "switch_layer", "switch_head"}


@pytest.mark.filterwarnings("ignore::FutureWarning")  # gc.get_objects() meets torch's deprecated aliases
def test_a_visitors_session_does_not_keep_evicted_recordings(monkeypatch):
    """Widgets' format functions and download callables live as long as the session and close over the view's
    context; they must not keep recordings alive past the byte-bounded cache (30 idle visitors would hold 30)."""
    import gc
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from apptest_util import run_app

    from app import gateway
    from app.panels import VIEWS
    from explorer_model.recording import Recording

    cache = gateway.result_cache()
    monkeypatch.setattr(cache, "budget", 1)  # keep only the newest recording
    at = run_app(view="tokens", prompt="The first prompt of this visitor.", model="tiny-pre")  # any model leaks alike
    for text in ("A second prompt, to evict the first.", "And a third one."):
        at.sidebar.text_area(key="prompt").set_value(text).run()
        for view, *_ in VIEWS:
            at.segmented_control(key="view").set_value(view).run()
            assert not at.exception
    gc.collect()
    cached = {id(r) for r in cache._items.values()}
    pinned = [o for o in gc.get_objects() if isinstance(o, Recording) and id(o) not in cached]
    assert not pinned, f"{len(pinned)} recordings outlive the cache"
