"""Live sessions that overlap on one engine share torch's one thread count: the last to end gives back the count from
before the first, whatever order they end in (a render after them runs on all its threads)."""

from __future__ import annotations

import threading

import torch

from ditto_fast.core.threads import sessions_threads


def test_overlapping_sessions_ending_in_the_other_order_give_the_threads_back():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        first, second = sessions_threads(2), sessions_threads(2)
        first.__enter__()
        assert torch.get_num_threads() == 2
        second.__enter__()
        first.__exit__(None, None, None)            # the first to start ends first
        assert torch.get_num_threads() == 2         # the other still streams
        second.__exit__(None, None, None)
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


def test_sessions_on_threads_of_their_own_give_the_threads_back():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    gates = [threading.Event() for _ in range(4)]

    def session(i: int) -> None:
        with sessions_threads(1):
            gates[i].wait(10)
    try:
        threads = [threading.Thread(target=session, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for g in reversed(gates):
            g.set()
        for t in threads:
            t.join(10)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
