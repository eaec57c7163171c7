"""Audio-length motion from the LMDM: 80-frame windows advancing by 70, cross-faded, then lightly smoothed."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

# sample_window(cond_frame [1,D], cond [1,W,C], generator) -> motion [1,W,D]
WindowSampler = Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


def window_starts(n: int, window: int = 80, overlap: int = 10) -> list[int]:
    """Start frame of every window needed to cover n frames."""
    step = window - overlap
    starts = [0]
    while starts[-1] + window < n:
        starts.append(starts[-1] + step)
    return starts


def centered_mean(x: np.ndarray, width: int) -> np.ndarray:
    """Centred moving mean along axis 0 with edge replication; width 1 returns a copy."""
    if width <= 1 or x.shape[0] < 2:
        return x.copy()
    half = width // 2
    padded = np.concatenate([np.repeat(x[:1], half, 0), x, np.repeat(x[-1:], half, 0)], axis=0)
    c = np.cumsum(np.concatenate([np.zeros_like(padded[:1]), padded], 0, dtype=np.float64), axis=0)
    return ((c[width:] - c[:-width]) / width).astype(x.dtype)


class MotionSampler:
    """Turns per-frame conditions [N,C] into per-frame motion [N,D] with a window sampler."""

    def __init__(self, sample_window: WindowSampler, window: int = 80, overlap: int = 10,
                 smooth_window: int = 3, smooth_dims: int = 202,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.sample_window = sample_window
        self.window, self.overlap = window, overlap
        self.smooth_window, self.smooth_dims = smooth_window, smooth_dims
        self.device, self.dtype = torch.device(device), dtype

    def __call__(self, cond: np.ndarray, source_motion: np.ndarray, generator: torch.Generator) -> np.ndarray:
        n = cond.shape[0]  # cond [N, C], source_motion [D]
        w, ov = self.window, self.overlap
        fade_new = (np.arange(1, ov + 1, dtype=np.float32) / (ov + 1))[:, None]   # weight of the new window
        starts = window_starts(n, w, ov)
        out = np.zeros((starts[-1] + w, source_motion.size), np.float32)
        cond_frame = source_motion.astype(np.float32)
        for start in starts:
            chunk = cond[start:start + w]
            if chunk.shape[0] < w:  # last window: repeat the last condition frame
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], w - chunk.shape[0], 0)], 0)
            pred = self.sample_window(
                torch.from_numpy(cond_frame[None]).to(self.device, self.dtype),
                torch.from_numpy(np.ascontiguousarray(chunk[None])).to(self.device, self.dtype),
                generator,
            )[0].float().cpu().numpy()  # [W, D]
            if start == 0:
                out[:w] = pred
            else:
                out[start:start + ov] = out[start:start + ov] * (1 - fade_new) + pred[:ov] * fade_new
                out[start + ov:start + w] = pred[ov:]
            cond_frame = out[start + w - ov - 1].copy()   # last frame this window keeps
        out = out[:n]
        d = min(self.smooth_dims, out.shape[1])
        out[:, :d] = centered_mean(out[:, :d], self.smooth_window)
        return out  # [N, D]
