"""Stage timers: accumulate wall and CPU seconds per named stage (owned by the pipelines, read by benchmarks)."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


class StageTimer:
    """timer("stage") is a context manager adding its wall time to seconds["stage"], the CPU time of this
    process (all its threads) to cpu_seconds["stage"] and that of the calling thread alone to
    thread_seconds["stage"]."""

    def __init__(self, stages: Iterable[str] = ()):
        self.seconds: dict[str, float] = defaultdict(float, {s: 0.0 for s in stages})
        self.cpu_seconds: dict[str, float] = defaultdict(float, {s: 0.0 for s in stages})
        self.thread_seconds: dict[str, float] = defaultdict(float, {s: 0.0 for s in stages})

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - t0
            self.cpu_seconds[stage] += time.process_time() - c0
            self.thread_seconds[stage] += time.thread_time() - h0

    def iterate(self, items: Iterable[T], stage: str) -> Iterator[T]:
        """Yield from `items`, counting the time spent producing each item as `stage`."""
        it = iter(items)
        while True:
            with self(stage):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

