"""Warp + decode shared by several threads (the live sessions an engine carries): the frames they ask for at about
the same time go through the device as one batch, and each thread gets back its own crops. On a GPU a batch of N
frames costs far less than N single frames (one launch, full occupancy); on a CPU it buys nothing, so an engine
shares it only on a GPU. A batch runs at one of core/graphs.BUCKETS frames (padded with its last frame's copies),
each captured at warm-up (`warm`), so that no capture happens while sessions stream."""

from __future__ import annotations

import numpy as np

from ditto_fast.core.gather import Gathered
from ditto_fast.core.graphs import BUCKETS, bucket
from ditto_fast.render.fused import FusedRenderer

GATHER_S = 0.004            # how long the first request of a batch waits for others
MOST = 8                    # frames in one batch at most


class SharedFused:
    """A FusedRenderer's `__call__` for many threads, batched: (f_s [B,...], x_s [B,21,3], x_d [B,21,3]) -> uint8
    crops [B,512,512,3], as `fused` gives them."""

    def __init__(self, fused: FusedRenderer, gather_s: float = GATHER_S, most: int = MOST):
        self.fused = fused
        self._gathered = Gathered(self._run, lambda ask: len(ask[0]), "shared-warp-decode", gather_s, most)

    @property
    def batches(self) -> int:
        """Batches run (what sharing bought: fewer than the frames)."""
        return self._gathered.batches

    @property
    def frames(self) -> int:
        """Frames in those batches."""
        return self._gathered.rows

    def __call__(self, f_s: np.ndarray, x_s: np.ndarray, x_d: np.ndarray) -> np.ndarray:
        ask = (np.asarray(f_s), np.asarray(x_s, np.float32), np.asarray(x_d, np.float32))
        if not len(ask[0]) == len(ask[1]) == len(ask[2]):       # refused here: it would fail a whole batch
            raise ValueError(f"f_s, x_s and x_d must have as many frames, got {len(ask[0])}, {len(ask[1])} and "
                             f"{len(ask[2])}")
        return self._gathered(ask)

    def warm(self, sample: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Run each batch size of BUCKETS up to MOST twice (eager, then captured where graphs are on), from one
        sample frame (f_s, x_s, x_d with one row each)."""
        for size in (b for b in BUCKETS if b <= self._gathered.most):
            for _ in range(2):
                self.fused(*(np.repeat(part[:1], size, axis=0) for part in sample))

    def _run(self, asks: list) -> list:
        rows = sum(len(a[0]) for a in asks)
        pad = bucket(rows) - rows
        parts = [np.concatenate([*part, *([part[-1][-1:]] * pad)]) for part in zip(*asks)]
        crops = self.fused(*parts)[:rows]
        ends = np.cumsum([len(a[0]) for a in asks])[:-1]
        return np.split(crops, ends)
