"""LMDM windows shared by several threads (the live sessions an engine carries): the windows they ask for at about the
same time are sampled as one batch, each row with its own session's generator, so each session's motion is what it
would be alone (up to the batch's float rounding). On a GPU the DDIM step is launch-bound, so a batch of N windows
costs little more than one; on a CPU it buys nothing, so an engine shares them only on a GPU."""

from __future__ import annotations

import torch

from ditto_fast.core.gather import Gathered
from ditto_fast.motion.ddim import DDIMSampler

GATHER_S = 0.004            # how long the first window of a batch waits for others
MOST = 8                    # windows in one batch at most


class SharedWindows:
    """A DDIMSampler's `__call__` for many threads, batched: (cond_frame [B, F], cond [B, N, C], generator) ->
    motion [B, N, F], as `sampler` gives it (a batch's rows draw from the generator of the call they came from)."""

    def __init__(self, sampler: DDIMSampler, gather_s: float = GATHER_S, most: int = MOST):
        self.sampler = sampler
        self._gathered = Gathered(self._run, lambda ask: len(ask[0]), "shared-lmdm-windows", gather_s, most)

    @property
    def batches(self) -> int:
        """Batches run (what sharing bought: fewer than the windows)."""
        return self._gathered.batches

    @property
    def windows(self) -> int:
        """Windows in those batches."""
        return self._gathered.rows

    def __call__(self, cond_frame: torch.Tensor, cond: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if len(cond_frame) != len(cond):        # refused here: it would fail a whole batch
            raise ValueError(f"cond_frame and cond must have as many rows, got {len(cond_frame)} and {len(cond)}")
        return self._gathered((cond_frame, cond, generator))

    def _run(self, asks: list) -> list:
        generators = [g for cond_frame, _, g in asks for _ in range(len(cond_frame))]
        out = self.sampler(torch.cat([a[0] for a in asks]), torch.cat([a[1] for a in asks]), generators)
        return list(out.split([len(a[0]) for a in asks]))
