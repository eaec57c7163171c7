"""Each output frame's place on the other timelines, as arrays: the source frame it shows, the 25 fps motion frames
around it, and the mirror loop that maps an endless timeline onto a source's frames.

The LMDM makes motion at 25 fps (one frame per 640 samples of 16 kHz audio). A clip at another rate
takes its frame i at time i / rate; `motion_timeline` says which two 25 fps motion frames surround
that time and how far between them it lies. All of it is integer arithmetic on fractions, so nothing
drifts however long the clip.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ditto_fast.media.rates import MOTION_FPS


def source_indices(n_out: int, out_rate: Fraction, src_rate: Fraction) -> np.ndarray:
    """[n_out] int64: the source frame shown at each output frame's time, before mirror-looping
    (floor(i * src_rate / out_rate); i itself when the rates are equal)."""
    return source_positions(np.arange(n_out, dtype=np.int64), out_rate, src_rate)


def source_positions(frames: np.ndarray, out_rate: Fraction, src_rate: Fraction) -> np.ndarray:
    """source_indices of any output frame numbers [K] (a live stream's, which has no first-to-last range)."""
    ratio = Fraction(src_rate) / Fraction(out_rate)
    return np.asarray(frames, dtype=np.int64) * ratio.numerator // ratio.denominator


def motion_timeline(n_out: int, out_rate: Fraction, n_motion: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output frame: the 25 fps motion frames (j0 [n_out], j1 [n_out]) around its time and the
    weight w [n_out] of j1 (0 at j0, exact 0 when the frame falls on a motion frame)."""
    j0, w = motion_positions(np.arange(n_out, dtype=np.int64), out_rate)
    last = max(0, n_motion - 1)
    j0 = np.minimum(j0, last)
    j1 = np.minimum(j0 + 1, last)
    w = np.where(j1 == j0, 0.0, w)
    return j0, j1, w.astype(np.float64)


def motion_positions(frames: np.ndarray, out_rate: Fraction) -> tuple[np.ndarray, np.ndarray]:
    """For output frame numbers [K]: the 25 fps motion frame at or before each one's time (j0 [K]) and how far past it
    the frame lies (w [K], 0 on a motion frame); no end to clamp at (motion_timeline clamps to a clip's)."""
    ratio = Fraction(MOTION_FPS) / Fraction(out_rate)
    pos = np.asarray(frames, dtype=np.int64) * ratio.numerator          # motion time * ratio.denominator
    return pos // ratio.denominator, (pos % ratio.denominator) / ratio.denominator


def mirror_index(i: int, n: int) -> int:
    """Plate frame for output frame i when looping n frames forward then backward: 0..n-1, n-1..0, 0.."""
    if n <= 0:
        raise ValueError(f"plate frame count must be positive, got {n}")
    r = i % (2 * n)
    return r if r < n else 2 * n - 1 - r


def mirror_indices(n_out: int, n_src: int) -> np.ndarray:
    """Source frame [n_out] int64 for each of n_out output frames, by mirror_index over n_src frames (at least 1)."""
    return mirror_positions(np.arange(n_out, dtype=np.int64), n_src)


def mirror_positions(positions: np.ndarray, n_src: int) -> np.ndarray:
    """mirror_index of each position [K] (frame numbers on an endless forward timeline) -> int64 [K]."""
    n = max(1, int(n_src))
    r = np.asarray(positions, dtype=np.int64) % (2 * n)
    return np.where(r < n, r, 2 * n - 1 - r)
