"""`llama-explorer classroom-check`: a short run against a shipped tiny model, whose answer must come from the run it
made, and which leaves no process behind, also when the run fails half-way. (Drives a server: marked `app`.)"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from explorer_model.cli import classroom_check as C
from explorer_model.cli import loadtest as L

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.app


def gone(pid: int) -> bool:
    """True when neither the process nor anything of its process group is still alive."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_short_check_answers_from_its_own_run_and_leaves_nothing_running():
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run([sys.executable, "-m", "explorer_model.cli", "classroom-check", "--students", "3",
                          "--pace", "1", "--duration", "5", "--model", "tiny-pre", "--json", "--lang", "en"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert "]" in out.stderr and "/" in out.stderr  # the progress bar: [####....] done/planned
    assert report["errors"] == 0, report["error_examples"]
    lat = report["latencies_s"]
    assert report["actions"] == sum(len(v) for v in lat.values()) >= 3 * 7
    switches = lat["switch_view"] + lat["switch_layer"] + lat["switch_head"]
    # the report's p95 comes from these latencies (listed to 4 decimals, the p95 rounded to 3: within rounding)
    assert report["p95_s"]["new_prompt"] == pytest.approx(L.percentile(lat["new_prompt"], 95), abs=6e-4)
    assert report["p95_s"]["switch"] == pytest.approx(L.percentile(switches, 95), abs=6e-4)
    assert report["peak_rss_mb"] > 100  # a Python server with a model loaded
    cpu = report["server_cpu"]
    assert cpu["seconds"] > 0 and cpu["per_action_s"] == round(cpu["seconds"] / report["actions"], 4)
    # the paragraph states the run's figures
    assert f"{report['p95_s']['new_prompt']:.1f} s for a new prompt" in report["answer"]
    assert f"{report['estimate_one_process']['students']} students" in report["answer"]
    assert gone(report["server_pid"])


def test_the_server_is_stopped_when_the_run_fails(monkeypatch):
    started = []
    real_start = L.start_server

    def start(*args, **kw):
        started.append(real_start(*args, **kw))
        return started[-1]

    async def broken(*args, **kw):
        raise RuntimeError("the students' network went away")

    monkeypatch.setattr(L, "start_server", start)
    monkeypatch.setattr(C, "_drive", broken)
    with pytest.raises(RuntimeError, match="network went away"):
        C.run_check(students=2, pace=1, duration=2, model="tiny-pre", progress=False)
    assert started and gone(started[0].pid)


def test_the_estimate_follows_the_measured_work():
    """Capacity = cores·u / (CPU per action × actions per student per second), u from each target."""
    times = {a: [] for a in L.ACTIONS}
    times["new_prompt"] = [0.4] * 20
    times["switch_view"] = [0.1] * 100
    # 120 actions by 10 students in 60 s: 0.2 actions per student per second; 24 CPU s: 0.2 s per action
    v = C.verdict(times, cpu_s=24.0, load_s=60.0, students=10, peak_rss_mb=900, cores=2)
    u_prompt, u_switch = 1 - C.P95_FACTOR * 0.4 / 3.0, 1 - C.P95_FACTOR * 0.1 / 1.5
    assert v["estimate_one_process"]["within_3s_new_prompt"] == int(u_prompt / (0.2 * 0.2))
    assert v["estimate_one_process"]["within_1.5s_switch"] == int(u_switch / (0.2 * 0.2))
    assert v["estimate_two_processes"]["students"] == int(2 * min(u_prompt, u_switch) / (0.2 * 0.2))
    one_core = C.verdict(times, cpu_s=24.0, load_s=60.0, students=10, peak_rss_mb=900, cores=1)
    assert one_core["estimate_two_processes"] == one_core["estimate_one_process"]
    assert not one_core["processes_2_helps"]


def test_the_answer_speaks_chinese_when_asked():
    times = {a: [0.2] * 10 for a in L.ACTIONS}
    report = {**C.verdict(times, 10.0, 60.0, 5, 800, 2), "students": 5, "pace_s": 10.0, "errors": 0,
              "error_examples": []}
    text = C.answer(report, "zh")
    assert "学生" in text and "MB" in text
    assert C.default_lang({"LANG": "zh_CN.UTF-8"}) == "zh" and C.default_lang({"LANG": "C.UTF-8"}) == "en"


def test_a_machine_too_slow_for_the_targets_is_told_so():
    """Waits over the targets with the server busy: never 'not needed'; when an action alone is too slow, the answer
    says that more processes cannot fix it."""
    times = {a: [] for a in L.ACTIONS}
    times["new_prompt"] = [1.6] * 10 + [10.0] * 10
    times["switch_view"] = [0.2] * 50
    v = C.verdict(times, cpu_s=80.0, load_s=100.0, students=30, peak_rss_mb=3000, cores=2)
    assert v["targets_missed"] and v["processes_2_helps"]
    report = {**v, "students": 30, "pace_s": 10.0, "errors": 0, "error_examples": []}
    assert "processes 2" in C.answer(report, "en") and "not needed" not in C.answer(report, "en")
    one = C.verdict(times, cpu_s=80.0, load_s=100.0, students=30, peak_rss_mb=3000, cores=1)
    text = C.answer({**one, "students": 30, "pace_s": 10.0, "errors": 0, "error_examples": []}, "en")
    assert "1.6 s" in text and "not needed" not in text


def test_memory_counts_a_mapped_file_once_for_a_group_of_processes(tmp_path):
    """Two processes mapping one 64 MB file hold its pages once; their private pages add up."""
    data = tmp_path / "weights.bin"
    data.write_bytes(os.urandom(64 * 2**20))
    child = ("import mmap, sys, time; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ);"
             " sum(m[i] for i in range(0, len(m), 4096)); b = bytearray(32 * 2**20); b[::4096] = b'x' * len(b[::4096]);"
             " print('ready', flush=True); time.sleep(60)")
    procs = [subprocess.Popen([sys.executable, "-c", child, str(data)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        one, both = L.memory_kb([procs[0].pid]), L.memory_kb([p.pid for p in procs])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    mb = 1024
    assert one["file"] >= 64 * mb and one["anon"] >= 32 * mb, one
    assert abs(both["file"] - one["file"]) < 8 * mb, (one, both)  # the file's pages once, not twice
    assert both["anon"] >= one["anon"] + 30 * mb, (one, both)  # each process's own pages
    assert both["total"] == both["anon"] + both["file"]
