"""Centred moving means over frames whose window shrinks at the sequence's ends, as Ditto smooths."""

from __future__ import annotations

import numpy as np


def centred_mean(x: np.ndarray, width: int) -> np.ndarray:
    """Centred moving mean along axis 0 of `x` [N, ...]; near either end the window is cut to what exists."""
    out = np.array(x, copy=True)
    smooth_range(out, 0, len(out), width)
    return out


def smooth_range(x: np.ndarray, start: int, stop: int, width: int, dims: int | None = None) -> None:
    """In place: frames [start, stop) of `x` [N, D...] become the centred mean of the input frames around them.

    The window is `width` frames (odd), cut at frame 0 and frame N-1; all means read the values
    from before this call. Only the first `dims` entries of axis 1 change when given.
    """
    n, half = len(x), width // 2
    start, stop = max(0, start), min(n, stop)
    if width <= 1 or stop <= start:
        return
    lo, hi = max(0, start - half), min(n, stop + half)
    region = x[lo:hi] if dims is None else x[lo:hi, :dims]
    c = np.concatenate([np.zeros_like(region[:1], np.float64), np.cumsum(region, 0, dtype=np.float64)], 0)
    i = np.arange(start, stop)
    a, b = np.maximum(i - half, 0) - lo, np.minimum(i + half + 1, n) - lo   # window [a, b) within the region
    count = (b - a).reshape((-1,) + (1,) * (region.ndim - 1))
    means = ((c[b] - c[a]) / count).astype(x.dtype)
    if dims is None:
        x[start:stop] = means
    else:
        x[start:stop, :dims] = means
