"""LMDM windows shared by several threads (the live sessions an engine carries): the windows they ask for at about the
same time are sampled as one batch, each row with its own session's generator, so each session's motion is what it
would be alone (up to the batch's float rounding). On a GPU the DDIM step is launch-bound, so a batch of N windows
costs little more than one; on a CPU it buys nothing, so an engine shares them only on a GPU. A batch runs at one of
core/graphs.BUCKETS rows (padded with copies of its last, drawing from a generator of their own), each captured at
warm-up (`warm`), so that no capture happens while sessions stream."""

from __future__ import annotations

import torch

from ditto_fast.core.gather import Gathered
from ditto_fast.core.graphs import BUCKETS, bucket
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

    def warm(self) -> None:
        """Sample a two-step window at each batch size of BUCKETS up to MOST (its step eager, then captured where
        graphs are on: the DDIM step's graphs are the engine's Denoiser's, whatever the step count)."""
        s = self.sampler
        net, device = s.net, s.net.input_projection.weight.device
        two = DDIMSampler(net, 2, s.guidance, s.denoise)
        for size in (b for b in BUCKETS if b <= self._gathered.most):
            gen = torch.Generator(device=device).manual_seed(0)
            two(torch.zeros((size, net.motion_dim), device=device),
                torch.zeros((size, net.seq_len, net.cond_dim), device=device), gen)

    def _run(self, asks: list) -> list:
        rows = sum(len(a[0]) for a in asks)
        pad = bucket(rows) - rows
        generators = [g for cond_frame, _, g in asks for _ in range(len(cond_frame))]
        if pad:                             # the padding rows draw their noise from a generator of their own
            spare = torch.Generator(device=asks[-1][0].device).manual_seed(0)
            generators += [spare] * pad
        cond_frame = torch.cat([a[0] for a in asks] + [asks[-1][0][-1:]] * pad)
        cond = torch.cat([a[1] for a in asks] + [asks[-1][1][-1:]] * pad)
        out = self.sampler(cond_frame, cond, generators)[:rows]
        return list(out.split([len(a[0]) for a in asks]))
