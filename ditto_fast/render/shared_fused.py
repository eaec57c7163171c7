"""Warp + decode shared by several threads (the live sessions an engine carries): the frames they ask for at about
the same time go through the device as one batch, and each thread gets back its own crops. On a GPU a batch of N
frames costs far less than N single frames (one launch, full occupancy); on a CPU it buys nothing, so an engine
shares it only on a GPU."""

from __future__ import annotations

import queue
import threading

import numpy as np

from ditto_fast.render.fused import FusedRenderer

GATHER_S = 0.004            # how long the first request of a batch waits for others
MOST = 8                    # frames in one batch at most


class _Ask:
    def __init__(self, f_s: np.ndarray, x_s: np.ndarray, x_d: np.ndarray):
        self.f_s, self.x_s, self.x_d = f_s, x_s, x_d
        self.crops: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class SharedFused:
    """A FusedRenderer's `__call__` for many threads, batched: (f_s [B,...], x_s [B,21,3], x_d [B,21,3]) -> uint8
    crops [B,512,512,3], as `fused` gives them."""

    def __init__(self, fused: FusedRenderer, gather_s: float = GATHER_S, most: int = MOST):
        self.fused, self.gather_s, self.most = fused, gather_s, most
        self.batches = 0                        # batches run, and frames in them (what sharing bought)
        self.frames = 0
        self._asks: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="shared-warp-decode", daemon=True)
        self._thread.start()

    def __call__(self, f_s: np.ndarray, x_s: np.ndarray, x_d: np.ndarray) -> np.ndarray:
        ask = _Ask(np.asarray(f_s), np.asarray(x_s, np.float32), np.asarray(x_d, np.float32))
        if not len(ask.f_s) == len(ask.x_s) == len(ask.x_d):       # refused here: it would fail a whole batch
            raise ValueError(f"f_s, x_s and x_d must have as many frames, got {len(ask.f_s)}, {len(ask.x_s)} and "
                             f"{len(ask.x_d)}")
        self._asks.put(ask)
        ask.done.wait()
        if ask.error is not None:
            raise ask.error
        return ask.crops

    def _run(self) -> None:
        while True:
            asks = [self._asks.get()]
            count = len(asks[0].f_s)
            while count < self.most:
                try:
                    ask = self._asks.get(timeout=self.gather_s)
                except queue.Empty:
                    break
                asks.append(ask)
                count += len(ask.f_s)
            try:
                crops = self.fused(np.concatenate([a.f_s for a in asks]), np.concatenate([a.x_s for a in asks]),
                                   np.concatenate([a.x_d for a in asks]))
                self.batches, self.frames = self.batches + 1, self.frames + len(crops)
                at = 0
                for a in asks:
                    a.crops, at = crops[at:at + len(a.f_s)], at + len(a.f_s)
            except BaseException as e:  # noqa: BLE001 - each asking thread raises it
                for a in asks:
                    a.error = e
            for a in asks:
                a.done.set()
