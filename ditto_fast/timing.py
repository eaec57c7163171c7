"""Stage timers: accumulate wall seconds per named stage (owned by the pipelines, read by benchmarks)."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


class StageTimer:
    """timer("stage") is a context manager adding its wall time to seconds["stage"]."""

    def __init__(self, stages: Iterable[str] = ()):
        self.seconds: dict[str, float] = defaultdict(float, {s: 0.0 for s in stages})

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - t0

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

