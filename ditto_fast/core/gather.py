"""Calls from several threads run together: what the live sessions an engine carries ask of the device at about the
same time goes through it as one batch (render/shared_fused.py, motion/shared_windows.py)."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable


class _Ask:
    def __init__(self, item: Any):
        self.item, self.result, self.error = item, None, None
        self.done = threading.Event()


class Gathered:
    """`run(items) -> results` (one result per item, in order) on one thread of its own; a call waits for its own
    result. The first item of a batch waits `gather_s` for others, until the batch holds `most` rows
    (`rows(item)` each); an error fails every call of its batch. `batches` and `rows` count what ran (what
    gathering bought)."""

    def __init__(self, run: Callable[[list], list], rows: Callable[[Any], int], name: str, gather_s: float,
                 most: int):
        self._run_batch, self._rows, self.gather_s, self.most = run, rows, gather_s, most
        self.batches = self.rows = 0
        self._asks: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __call__(self, item: Any) -> Any:
        ask = _Ask(item)
        self._asks.put(ask)
        ask.done.wait()
        if ask.error is not None:
            raise ask.error
        return ask.result

    def _run(self) -> None:
        while True:
            asks = [self._asks.get()]
            count = self._rows(asks[0].item)
            while count < self.most:
                try:
                    ask = self._asks.get(timeout=self.gather_s)
                except queue.Empty:
                    break
                asks.append(ask)
                count += self._rows(ask.item)
            try:
                for a, result in zip(asks, self._run_batch([a.item for a in asks]), strict=True):
                    a.result = result
                self.batches, self.rows = self.batches + 1, self.rows + count
            except BaseException as e:  # noqa: BLE001 - each asking thread raises it
                for a in asks:
                    a.error = e
            for a in asks:
                a.done.set()
