"""Calls from several threads run together: what the live sessions an engine carries ask of the device at about the
same time goes through it as one batch (render/shared_fused.py, motion/shared_windows.py)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable


class _Ask:
    def __init__(self, item: Any):
        self.item, self.result, self.error = item, None, None
        self.done = threading.Event()


class Gathered:
    """`run(items) -> results` (one result per item, in order) on one thread of its own; a call waits for its own
    result. A batch gathers for at most `gather_s` from its first item, and at most `most` rows (`rows(item)` each;
    an item of more runs alone); a batch that fails runs again item by item, so that each call gets its own result
    or its own error. `batches` and `rows` count what ran (what gathering bought)."""

    def __init__(self, run: Callable[[list], list], rows: Callable[[Any], int], name: str, gather_s: float,
                 most: int):
        self._run_batch, self._rows, self.gather_s, self.most = run, rows, gather_s, most
        self.batches = self.rows = 0
        self._asks: queue.Queue = queue.Queue()
        self._next: _Ask | None = None          # an ask that did not fit in the last batch: the next one's first
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __call__(self, item: Any) -> Any:
        ask = _Ask(item)
        self._asks.put(ask)
        ask.done.wait()
        if ask.error is not None:
            raise ask.error
        return ask.result

    def _gather(self) -> list[_Ask]:
        """The next batch: its first ask, then those that come within gather_s of it while they fit in `most` rows."""
        first, self._next = self._next or self._asks.get(), None
        asks, count = [first], self._rows(first.item)
        deadline = time.monotonic() + self.gather_s
        while count < self.most:
            try:
                ask = self._asks.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if count + self._rows(ask.item) > self.most:
                self._next = ask
                break
            asks.append(ask)
            count += self._rows(ask.item)
        return asks

    def _run(self) -> None:
        while True:
            asks = self._gather()
            try:
                self._answer(asks)
            except BaseException:  # noqa: BLE001 - each alone: its own result or its own error
                for a in asks:
                    try:
                        self._answer([a])
                    except BaseException as e:  # noqa: BLE001 - raised in its caller's thread
                        a.error = e
            for a in asks:
                a.done.set()

    def _answer(self, asks: list[_Ask]) -> None:
        for a, result in zip(asks, self._run_batch([a.item for a in asks]), strict=True):
            a.result = result
        self.batches, self.rows = self.batches + 1, self.rows + sum(self._rows(a.item) for a in asks)
