"""The drawing lane (app/gateway/lanes.py): one page run draws at a time, and a page run gives the lane up while it waits
for or runs a forward pass, so other pages draw meanwhile and a forward pass competes with one drawer at most."""
import threading

from app.gateway.lanes import DrawingLane, FifoLock, ForwardLock


def in_thread(fn):
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("value", fn()))
    th.start()
    th.join(5)
    assert not th.is_alive()
    return out.get("value")


def lane_is_free(lane: DrawingLane) -> bool:
    """Whether another thread can take the lane right now."""
    def probe():
        got = lane._lock.acquire(blocking=False)
        if got:
            lane._lock.release()
        return got
    return in_thread(probe)


def test_one_page_draws_at_a_time_and_nested_runs_do_not_deadlock():
    lane = DrawingLane()
    with lane.held():
        assert lane.holding() and not lane_is_free(lane)
        with lane.held():  # AppTest runs a page inside the caller's thread
            assert not lane_is_free(lane)
        assert not lane_is_free(lane)
    assert not lane.holding() and lane_is_free(lane)


def test_the_forward_lock_gives_the_lane_up_and_takes_it_back():
    lane = DrawingLane()
    forward = ForwardLock(lane)
    with lane.held():
        with forward:
            assert not lane.holding() and lane_is_free(lane)  # others draw while this page's forward runs
            assert not in_thread(lambda: forward._lock.acquire(timeout=0.05))  # but no second forward
            with forward:  # re-entrant, as a what-if's KL records the clean prompt under the same lock
                assert lane_is_free(lane)
            assert lane_is_free(lane)
        assert lane.holding() and not lane_is_free(lane)
    with forward:  # outside a page run (a download callback): nothing to give up
        assert not lane.holding()
    assert lane_is_free(lane) and in_thread(lambda: forward._lock.acquire(timeout=0.05))


def test_a_page_waiting_for_the_lane_gets_it_when_the_forward_starts():
    lane = DrawingLane()
    forward = ForwardLock(lane)
    drew = threading.Event()

    def other_page():
        with lane.held():
            drew.set()

    with lane.held():
        th = threading.Thread(target=other_page)
        th.start()
        assert not drew.wait(0.1)  # waits while this page draws
        with forward:
            assert drew.wait(5)  # drew while this page's forward ran
        th.join(5)
    assert not th.is_alive()


def test_the_lane_is_handed_over_in_arrival_order():
    lock, order, started = FifoLock(), [], []
    lock.acquire()

    def waiter(i):
        started.append(i)
        lock.acquire()
        order.append(i)
        lock.release()

    threads = []
    for i in range(5):
        threads.append(threading.Thread(target=waiter, args=(i,)))
        threads[-1].start()
        while len(started) <= i or len(lock._waiters) <= i:  # the i-th waiter is queued before the next starts
            threading.Event().wait(0.001)
    lock.release()
    for th in threads:
        th.join(5)
    assert order == [0, 1, 2, 3, 4]
    assert lock.acquire(blocking=False)


def test_queue_lengths_that_waiting_visitors_are_shown():
    lane = DrawingLane()
    forward = ForwardLock(lane)
    assert lane.pages() == 0 and forward.wanted() == 0
    entered, leave = threading.Event(), threading.Event()

    def other_page():
        with lane.held():
            with forward:
                entered.set()
                leave.wait(5)

    th = threading.Thread(target=other_page)
    th.start()
    assert entered.wait(5)
    assert forward.wanted() == 1 and lane.pages() == 0  # its page gave the lane up while its forward runs
    with lane.held():
        assert lane.pages() == 1
        leave.set()  # its forward ends; it waits for the lane to draw again, behind this page
        for _ in range(5000):
            if lane.pages() == 2:
                break
            threading.Event().wait(0.001)
        assert lane.pages() == 2 and forward.wanted() == 0 and th.is_alive()
    th.join(5)
    assert not th.is_alive()
    assert forward.wanted() == 0 and lane.pages() == 0


def test_a_waiter_on_the_forward_lock_finds_the_result_it_waited_for():
    """The result is stored before the lock opens: a visitor who waited never computes it a second time, even when
    storing it takes a while (here: a slow put)."""
    import time

    from app.gateway.result_cache import ResultCache

    cache, lock, computed = ResultCache(2**30), threading.RLock(), []
    real_put = cache.put

    def slow_put(key, value, **kw):
        time.sleep(0.1)
        return real_put(key, value, **kw)
    cache.put = slow_put

    def compute():
        computed.append(1)
        time.sleep(0.05)
        return [len(computed)]

    out = []
    threads = [threading.Thread(target=lambda: out.append(cache.get(("k",), compute, lock))) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(5)
    assert computed == [1] and all(o is out[0] for o in out) and len(out) == 4


def test_a_page_back_from_a_forward_pass_draws_before_pages_that_arrived_meanwhile():
    lane = DrawingLane()
    forward = ForwardLock(lane)
    order, in_forward, forward_done, waiting = [], threading.Event(), threading.Event(), []

    def page_with_forward():
        with lane.held():
            with forward:
                in_forward.set()
                forward_done.wait(5)
            order.append("back from the forward")

    def later_page(i):
        waiting.append(i)
        with lane.held():
            order.append(f"page {i}")

    first = threading.Thread(target=page_with_forward)
    holder_ready, release_holder = threading.Event(), threading.Event()

    def holder():  # a page drawing while the forward runs
        with lane.held():
            holder_ready.set()
            release_holder.wait(5)
            order.append("holder")
    first.start()
    assert in_forward.wait(5)
    h = threading.Thread(target=holder)
    h.start()
    assert holder_ready.wait(5)
    others = [threading.Thread(target=later_page, args=(i,)) for i in range(3)]
    for i, th in enumerate(others):
        th.start()
        while len(lane._lock._waiters) <= i:  # queued in this order, behind the holder
            threading.Event().wait(0.001)
    forward_done.set()
    while len(lane._lock._waiters) < 4:  # the first page is back in the line
        threading.Event().wait(0.001)
    release_holder.set()
    for th in (first, h, *others):
        th.join(5)
    assert order == ["holder", "back from the forward", "page 0", "page 1", "page 2"]


def test_pages_asking_for_the_same_result_at_once_compute_it_once_without_deadlock():
    """Thirty followers reach a lecture step together: the first page computes a key, the others wait for it and
    find it cached. A page waits for a key with the drawing lane given up, because the page computing it may need
    the lane to finish (derived data is computed outside the lane and handed back inside it)."""
    from app.gateway.lanes import Flights
    from app.gateway.result_cache import ResultCache

    lane = DrawingLane()
    flights, cache, computed = Flights(lane), ResultCache(2**30), []
    first_inside, waiter_waits = threading.Event(), threading.Event()

    def compute():  # as gateway.derived: array work outside the lane, then the lane taken back to draw
        computed.append(1)
        first_inside.set()
        with lane.released():
            assert waiter_waits.wait(5)
        return [len(computed)]

    def page(out):
        with lane.held():
            out.append(cache.get(("view", 1), compute, flights.one(("view", 1))))

    first_out, second_out = [], []
    first = threading.Thread(target=page, args=(first_out,), daemon=True)  # a deadlock must fail, not hang
    first.start()
    assert first_inside.wait(5)
    second = threading.Thread(target=page, args=(second_out,), daemon=True)
    second.start()
    while flights._keys[("view", 1)][1] < 2:  # until the second page waits for the key
        threading.Event().wait(0.001)
    waiter_waits.set()
    for th in (first, second):
        th.join(5)
        assert not th.is_alive()
    assert computed == [1] and first_out == second_out == [[1]] and second_out[0] is first_out[0]
    assert flights._keys == {} and lane_is_free(lane)


def test_threads_switch_quickly_only_while_a_forward_pass_or_array_work_runs(monkeypatch):
    """While work that gives the GIL up at every torch call runs (a forward pass, a view's array work), the
    interpreter hands the GIL over every 0.1 ms; with only Python running (page runs), at Python's own 5 ms."""
    import sys

    import pytest

    from app.gateway import lanes, runs

    monkeypatch.setattr(runs, "recording", lambda source, ids: "the recording")
    monkeypatch.setattr(runs, "_ident", lambda source: source)
    seen = []
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(lanes.PYTHON_SWITCH_INTERVAL_S)
        lane = DrawingLane()
        forward = ForwardLock(lane)
        with lane.held():
            seen.append(sys.getswitchinterval())
            with forward:
                seen.append(sys.getswitchinterval())
                with forward:  # re-entrant: quick until the outer exit
                    pass
                seen.append(sys.getswitchinterval())
            seen.append(sys.getswitchinterval())
            seen.append(runs.derived("switch-probe", "a source", (1, 2), lambda rec: sys.getswitchinterval()))
            seen.append(sys.getswitchinterval())
        assert seen == pytest.approx([0.005, 0.0001, 0.0001, 0.005, 0.0001, 0.005])
        assert lanes.SWITCHES.running() == 0
    finally:
        sys.setswitchinterval(before)
