"""StageTimer: wall and CPU seconds per stage."""

from __future__ import annotations

import time

from ditto_fast.core.timing import StageTimer


def test_stage_timer_counts_wall_and_cpu_per_stage():
    t = StageTimer(["idle"])
    assert t.seconds["idle"] == 0.0 and t.cpu_seconds["idle"] == 0.0
    with t("busy"):
        c0 = time.thread_time()
        while time.thread_time() - c0 < 0.05:    # 50 ms of this thread's CPU
            pass
    with t("sleep"):
        time.sleep(0.2)
    assert t.cpu_seconds["busy"] >= 0.05 and t.seconds["busy"] >= 0.05
    assert t.seconds["sleep"] >= 0.2 and t.cpu_seconds["sleep"] < 0.1   # process-wide: other threads may tick
    assert t.thread_seconds["busy"] >= 0.05 and t.thread_seconds["sleep"] < 0.02


def test_thread_seconds_leave_out_other_threads():
    import threading

    def spin():
        c0 = time.thread_time()
        while time.thread_time() - c0 < 0.15:
            pass

    t = StageTimer()
    with t("wait"):
        worker = threading.Thread(target=spin)
        worker.start()
        worker.join()
    assert t.cpu_seconds["wait"] >= 0.15 and t.thread_seconds["wait"] < 0.05


def test_iterate_times_the_producer_only():
    t = StageTimer()

    def slow():
        for i in range(3):
            time.sleep(0.02)
            yield i

    got = []
    for item in t.iterate(slow(), "produce"):
        got.append(item)
        with t("consume"):
            pass
    assert got == [0, 1, 2] and t.seconds["produce"] >= 0.06 and t.seconds["consume"] < 0.03
