"""Audio-length motion from the LMDM, chained window by window exactly as Ditto's offline loop does it.

Windows of `window` frames start every `window - overlap` frames while frames remain (so a clip of
N frames takes ceil(N / (window - overlap)) windows). Each new window is conditioned on the frame
just before the previous window's overlap tail, its first `overlap` frames are cross-faded into that
tail with weights 0, 1/overlap, ..., (overlap-1)/overlap for the new window, and the pose dims are
smoothed where the seam was made; the whole sequence is smoothed once more at the end.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ditto_fast.core.smoothing import smooth_range
from ditto_fast.motion.keypoints import SMOOTHED_DIMS

# sample_window(cond_frame [1,D], cond [1,W,C], generator) -> motion [1,W,D]
WindowSampler = Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


def window_starts(n: int, window: int = 80, overlap: int = 10) -> list[int]:
    """Start frame of every window the loop samples for n frames (one more while frames remain)."""
    return list(range(0, n, window - overlap))


class MotionSampler:
    """Turns per-frame conditions [N,C] into per-frame motion [N,D] with a window sampler."""

    def __init__(self, sample_window: WindowSampler, window: int = 80, overlap: int = 10,
                 smooth_window: int = 3, smooth_dims: int = SMOOTHED_DIMS,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        if not 0 < overlap < window:
            raise ValueError(f"overlap must be in 1..{window - 1}, got {overlap}")
        self.sample_window = sample_window
        self.window, self.overlap = window, overlap
        self.smooth_window, self.smooth_dims = smooth_window, smooth_dims
        self.device, self.dtype = torch.device(device), dtype

    def _sample(self, cond_frame: np.ndarray, chunk: np.ndarray, generator: torch.Generator) -> np.ndarray:
        """One window: cond_frame [D], chunk [<=W, C] padded with its last row -> motion [W, D]."""
        if len(chunk) < self.window:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], self.window - len(chunk), 0)], 0)
        pred = self.sample_window(
            torch.from_numpy(np.ascontiguousarray(cond_frame[None], np.float32)).to(self.device, self.dtype),
            torch.from_numpy(np.ascontiguousarray(chunk[None], np.float32)).to(self.device, self.dtype),
            generator,
        )
        return pred[0].float().cpu().numpy()  # [W, D]

    def __call__(self, cond: np.ndarray, source_motion: np.ndarray, generator: torch.Generator,
                 progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Motion [N, D] for conditions [N, C] from the source's motion [D]; `progress(frames made, N)` is called
        before the first window and after each."""
        n = cond.shape[0]  # cond [N, C], source_motion [D]
        if n < 1:
            raise ValueError("no condition frames to sample motion for")
        w, ov, k = self.window, self.overlap, self.smooth_window
        step = w - ov                                                     # new frames per window
        fade = (np.arange(ov, dtype=np.float32) / ov)[:, None]            # weight of the new window
        starts = window_starts(n, w, ov)
        out = np.empty((w + step * (len(starts) - 1), source_motion.size), np.float32)
        cond_frame = source_motion.astype(np.float32)
        length = 0                                                        # frames of `out` made so far
        if progress is not None:
            progress(0, n)
        for start in starts:
            pred = self._sample(cond_frame, cond[start:start + w], generator)
            if length == 0:
                out[:w] = pred
                length = w
                smooth_range(out[:length], 0, length, k, self.smooth_dims)
            else:
                tail = out[length - ov:length]
                tail[:] = tail * (1 - fade) + pred[:ov] * fade
                out[length:length + step] = pred[ov:]
                length += step
                # the seam and the first frame after it
                smooth_range(out[:length], length - step - ov, length - step + 1, k, self.smooth_dims)
            cond_frame = out[length - ov - 1].copy()                      # conditions the next window
            if progress is not None:
                progress(min(length, n), n)
        out = out[:n]
        smooth_range(out, 0, n, k, self.smooth_dims)
        return out  # [N, D]
