"""Calls from several threads gathered into batches: a batch waits at most `gather_s` from its first item (not after
each), never holds more than `most` rows, and a failing batch fails only the calls whose items fail."""

from __future__ import annotations

import threading
import time

import pytest

from ditto_fast.core.gather import Gathered


def _recorded(fail_on=None):
    batches: list[list] = []

    def run(items: list) -> list:
        batches.append(list(items))
        if fail_on is not None and fail_on in items:
            raise ValueError(f"bad item {fail_on}")
        return [i * 10 for i in items]
    return batches, run


def _call_from_threads(gathered: Gathered, items: list, every_s: float = 0.0) -> dict:
    got: dict = {}

    def one(i):
        try:
            got[i] = gathered(i)
        except Exception as e:  # noqa: BLE001
            got[i] = e
    threads = []
    for i in items:
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
        time.sleep(every_s)
    for t in threads:
        t.join(30)
    return got


def test_a_batch_gathers_from_its_first_item_not_after_each():
    batches, run = _recorded()
    gathered = Gathered(run, lambda item: 1, "test-gather", gather_s=0.25, most=100)
    got = _call_from_threads(gathered, list(range(8)), every_s=0.1)      # one every 0.1 s for 0.7 s
    assert got == {i: i * 10 for i in range(8)}
    assert len(batches) >= 3, batches            # a deadline renewed by each item would have taken all 8 at once
    assert all(len(b) <= 4 for b in batches), batches


def test_a_batch_never_holds_more_than_most_rows():
    batches, run = _recorded()

    def slow_run(items):                         # while a batch runs, the others' items pile up
        time.sleep(0.2)
        return run(items)
    gathered = Gathered(slow_run, lambda item: 2 if item % 2 else 1, "test-most", gather_s=0.5, most=4)
    got = _call_from_threads(gathered, list(range(9)))
    assert got == {i: i * 10 for i in range(9)}
    rows = [sum(2 if i % 2 else 1 for i in b) for b in batches]
    assert max(rows) <= 4 and sorted(i for b in batches for i in b) == list(range(9)), batches
    assert gathered.rows == sum(rows) and gathered.batches == len(batches)


def test_one_bad_item_fails_its_own_call_only():
    batches, run = _recorded(fail_on=3)
    gathered = Gathered(run, lambda item: 1, "test-error", gather_s=0.3, most=8)
    got = _call_from_threads(gathered, [1, 2, 3, 4])
    assert isinstance(got[3], ValueError) and "bad item 3" in str(got[3])
    assert {i: got[i] for i in (1, 2, 4)} == {1: 10, 2: 20, 4: 40}


def test_an_item_larger_than_most_runs_alone():
    batches, run = _recorded()
    gathered = Gathered(run, lambda item: 10 if item == 0 else 1, "test-large", gather_s=0.2, most=4)
    assert _call_from_threads(gathered, [0, 1, 2]) == {0: 0, 1: 10, 2: 20}
    assert [0] in batches
    with pytest.raises(ValueError):
        Gathered(_recorded(fail_on=5)[1], lambda item: 1, "test-raise", gather_s=0.0, most=1)(5)
