"""Colour matched at the seam: the difference plate - crop, taken along the face mask's feathered edge in the
plate's own planes, filled smoothly across the inside (a multi-scale push-pull, the membrane's cheap
equivalent) on a coarse grid over the crop, and smoothed over frames. The putback adds it to the crop inside the
mask, so the face keeps its own detail and meets the plate at the plate's own values.

Bounded against smear: edge samples further than BOUND levels from the edge's median (a hand, a microphone or
dark hair across the edge) are left out, and the correction itself is held within BOUND of that median.

A cast multiplies, so no additive correction matches it on the skin and on the edge at once: `GainMatch` fits a
gain per RGB channel to the same edge samples and takes it only as far as it explains the edge far better than an
offset does (a re-synthesised background also reads as a gain, but one that leaves the edge's spread; see
docs/putback.md); the putback folds it into the crop's RGB -> YUV matrix, the membrane corrects what is left.
"""

from __future__ import annotations

from typing import Callable

import cv2
import numpy as np

from ditto_fast.media.yuv import Layout

CELLS = 32                  # correction cells across the crop (16 px each at 512)
BOUND = 24.0                # 8-bit levels (see the module docstring; measured in tests/test_render_seam.py)
SMOOTH = 0.35               # weight of the new frame's correction in the running mean (1: no smoothing)
EDGE = (0.02, 0.98)         # mask values that count as its edge
GAIN = (0.9, 1.1)           # the gains GainMatch may take
GAIN_GATE = (0.3, 0.5)      # ... wholly where they leave the edge's mean deviation under the first share of an
                            # offset's, not at all past the second, in proportion between (no switching on noise)


def push_pull(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Fill a grid [K, K, C] where weights [K, K] are 0 from where they are not: sums pushed down to 1x1, then
    pulled back up level by level, each level keeping its own values where it has weight and taking the coarser
    level's (bilinearly upsampled) elsewhere. K a power of two."""
    k = values.shape[0]
    levels = [(values * weights[..., None], weights.astype(np.float64))]
    while k > 1:
        v, w = levels[-1]
        k //= 2
        levels.append((v.reshape(k, 2, k, 2, -1).sum((1, 3)), w.reshape(k, 2, k, 2).sum((1, 3))))
    v, w = levels[-1]
    filled = v / np.maximum(w, 1e-12)[..., None]
    for v, w in reversed(levels[:-1]):
        size = w.shape[0]
        up = cv2.resize(filled.astype(np.float32), (size, size), interpolation=cv2.INTER_LINEAR).reshape(size, size, -1)
        own = v / np.maximum(w, 1e-12)[..., None]
        keep = np.minimum(w, 1.0)[..., None]
        filled = keep * own + (1.0 - keep) * up
    return filled


class SeamMatch:
    """Per output frame, the colour correction grid [CELLS, CELLS, 3] (Y, U, V code values) to add to the crop
    inside the mask; `reset()` at a plate jump. Cell i covers crop pixels i * dsize / CELLS onwards (as cv2.resize
    sees it)."""

    def __init__(self, layout: Layout, dsize: int = 512, bound: float = BOUND, smooth: float = SMOOTH,
                 kernel: Callable | None = None):
        self.layout, self.dsize, self.kernel = layout, dsize, kernel      # kernel: _blend.seam_correction, or numpy
        self.bound = bound * layout.scale
        self.smooth = smooth
        self._last: np.ndarray | None = None

    def reset(self) -> None:
        """Forget the running mean (a cut, or the plate's mirror loop turning)."""
        self._last = None

    def __call__(self, mask: np.ndarray, crop_yuv: np.ndarray, planes: tuple[np.ndarray, np.ndarray],
                 M_c2o: np.ndarray) -> np.ndarray:
        """The correction for a frame: `mask` the face mask grid [G, G], `crop_yuv` the crop's Y, U, V at each mask
        cell's centre [G, G, 3] float32 (code values), `planes` the plate's luma [1, H, W] and chroma [2, H/cv, W/2]."""
        g = mask.shape[0]
        if self.kernel is not None:
            raw = np.empty((CELLS, CELLS, 3), np.float32)
            m = np.ascontiguousarray(np.asarray(M_c2o, np.float64)[:2]).ravel()
            edges = self.kernel(mask, crop_yuv, planes[0], planes[1], m, self.layout.chroma_rows, self.dsize / g,
                                EDGE[0], EDGE[1], self.bound, raw)
            return self._running(raw if edges >= 8 else np.zeros_like(raw))
        rows, cols = np.nonzero((mask > EDGE[0]) & (mask < EDGE[1]))
        if len(rows) < 8:
            raw = np.zeros((CELLS, CELLS, 3), np.float32)
            return self._running(raw)
        cell = self.dsize / g
        xs, ys = (cols + 0.5) * cell - 0.5, (rows + 0.5) * cell - 0.5              # cell centres, crop pixels
        m = np.asarray(M_c2o, np.float64)
        fx, fy = m[0, 0] * xs + m[0, 1] * ys + m[0, 2], m[1, 0] * xs + m[1, 1] * ys + m[1, 2]
        plate = _sample_planes(planes, fx, fy, self.layout)                         # [K, 3]
        inside = np.isfinite(plate[:, 0])
        diff = plate - crop_yuv[rows, cols]                                         # [K, 3]
        centre = np.median(diff[inside], axis=0) if inside.any() else np.zeros(3)
        ok = inside & (np.abs(diff - centre) <= self.bound).all(axis=1)
        weight_grid = np.zeros((CELLS, CELLS))
        value_grid = np.zeros((CELLS, CELLS, 3))
        if ok.any():
            cr, cc = (rows[ok] * CELLS) // g, (cols[ok] * CELLS) // g
            flat = cr * CELLS + cc
            weight_grid.flat[:] = np.bincount(flat, minlength=CELLS * CELLS)
            for c in range(3):
                value_grid[..., c].flat[:] = np.bincount(flat, diff[ok, c], minlength=CELLS * CELLS)
            value_grid /= np.maximum(weight_grid, 1)[..., None]
            weight_grid = np.minimum(weight_grid, 1.0)
        raw = push_pull(value_grid, weight_grid) if ok.any() else np.zeros((CELLS, CELLS, 3))
        raw = np.clip(raw, centre - self.bound, centre + self.bound).astype(np.float32)
        return self._running(raw)

    def _running(self, raw: np.ndarray) -> np.ndarray:
        self._last = raw if self._last is None else self._last + np.float32(self.smooth) * (raw - self._last)
        return np.ascontiguousarray(self._last, np.float32)


class GainMatch:
    """Per output frame, gains [3] for the crop's R, G, B that bring it to the plate along the mask's edge (1 where a
    gain would not explain the edge), smoothed over frames; `reset()` at a plate jump."""

    def __init__(self, layout: Layout, to_yuv: np.ndarray, bound: float = BOUND, smooth: float = SMOOTH):
        self.layout, self.smooth = layout, smooth
        self.bound = bound              # 8-bit RGB levels at any plane depth: the fit is in RGB (SeamMatch's is scaled)
        self._yuv_to_rgb = cv2.invert(np.asarray(to_yuv[:, :3], np.float64))[1]     # the planes' code values -> RGB
        self._offset = np.asarray(to_yuv[:, 3], np.float64)
        self._last: np.ndarray | None = None

    def reset(self) -> None:
        """Forget the running mean (a cut, or the plate's mirror loop turning)."""
        self._last = None

    def __call__(self, mask: np.ndarray, crop_rgb: np.ndarray, planes: tuple[np.ndarray, np.ndarray],
                 M_c2o: np.ndarray, dsize: int) -> np.ndarray:
        """The gains for a frame: `mask` the face mask grid [G, G], `crop_rgb` the crop at each cell's centre [G, G, 3]."""
        rows, cols = np.nonzero((mask > EDGE[0]) & (mask < EDGE[1]))
        gains = np.ones(3)
        if len(rows) >= 8:
            cell = dsize / mask.shape[0]
            xs, ys = (cols + 0.5) * cell - 0.5, (rows + 0.5) * cell - 0.5
            m = np.asarray(M_c2o, np.float64)
            sampled = _remap_planes(planes, m[0, 0] * xs + m[0, 1] * ys + m[0, 2], m[1, 0] * xs + m[1, 1] * ys + m[1, 2],
                                    self.layout)
            if sampled is not None:
                yuv, on = sampled                                                      # channels first: [3, K]
                plate = self._yuv_to_rgb @ (yuv - self._offset[:, None])               # RGB
                crop = np.ascontiguousarray(crop_rgb[rows[on], cols[on]].T, np.float64)
                diff = plate - crop
                ok = (np.abs(diff - np.median(diff, axis=1, keepdims=True)) <= self.bound).all(axis=0)
                if ok.sum() >= 8:
                    gains = _gains(crop[:, ok], plate[:, ok])
        self._last = gains if self._last is None else self._last + self.smooth * (gains - self._last)
        return self._last


def _gains(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per channel of samples x -> y [3, K]: the regression's slope (bounded to GAIN) as far as y - slope * x spreads (mean
    absolute deviation) less than y - x does, by GAIN_GATE (wholly at the first share, not at all at the second)."""
    xc, yc = x - x.mean(axis=1, keepdims=True), y - y.mean(axis=1, keepdims=True)
    slope = np.clip((xc * yc).sum(axis=1) / np.maximum((xc * xc).sum(axis=1), 1e-6), *GAIN)
    spread = [np.abs(d - d.mean(axis=1, keepdims=True)).mean(axis=1) for d in (yc - xc, yc - slope[:, None] * xc)]
    share = spread[1] / np.maximum(spread[0], 1e-6)
    weight = np.clip((GAIN_GATE[1] - share) / (GAIN_GATE[1] - GAIN_GATE[0]), 0.0, 1.0)
    return 1.0 + weight * (slope - 1.0)


def _remap_planes(planes: tuple[np.ndarray, np.ndarray], fx: np.ndarray, fy: np.ndarray, layout: Layout
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """The plate's Y, U, V [3, K'] float64 at the frame positions (fx, fy) [K] on the frame, by OpenCV's bilinear remap
    (three calls, where _sample_planes takes a dozen numpy ones), and which positions those are; None under 8."""
    luma, chroma = planes
    h, w = luma.shape[1:]
    on = (fx >= 0) & (fy >= 0) & (fx <= w - 1) & (fy <= h - 1)
    if on.sum() < 8:
        return None
    fx, fy = fx[on], fy[on]
    rows = layout.chroma_rows
    at = (fx.astype(np.float32)[None], fy.astype(np.float32)[None])
    at_c = (((fx - 0.5) / 2).astype(np.float32)[None], ((fy - 0.5 * (rows - 1)) / rows).astype(np.float32)[None])
    flags = dict(interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return np.vstack([cv2.remap(luma[0], *at, **flags), cv2.remap(chroma[0], *at_c, **flags),
                      cv2.remap(chroma[1], *at_c, **flags)]).astype(np.float64), on


def _sample_planes(planes: tuple[np.ndarray, np.ndarray], fx: np.ndarray, fy: np.ndarray, layout: Layout) -> np.ndarray:
    """The plate's Y, U, V at frame positions (fx, fy) [K], bilinear (each chroma plane at its own sample positions;
    NaN off the frame): [K, 3] float."""
    luma, chroma = planes
    h, w = luma.shape[1:]
    on = (fx >= 0) & (fy >= 0) & (fx <= w - 1) & (fy <= h - 1)
    out = np.full((len(fx), 3), np.nan)
    fx, fy = fx[on], fy[on]
    out[on, 0] = _bilinear(luma[0], fx, fy)
    cx, cy = (fx - 0.5) / 2, (fy - 0.5 * (layout.chroma_rows - 1)) / layout.chroma_rows
    out[on, 1] = _bilinear(chroma[0], cx, cy)
    out[on, 2] = _bilinear(chroma[1], cx, cy)
    return out


def _bilinear(plane: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """plane [h, w] sampled bilinearly at (x, y) [K] (clamped to its edge samples)."""
    h, w = plane.shape
    x, y = np.clip(x, 0, w - 1), np.clip(y, 0, h - 1)
    x0, y0 = np.minimum(x.astype(np.int64), w - 2), np.minimum(y.astype(np.int64), h - 2)
    ax, ay = x - x0, y - y0
    top = plane[y0, x0] * (1 - ax) + plane[y0, x0 + 1] * ax
    bottom = plane[y0 + 1, x0] * (1 - ax) + plane[y0 + 1, x0 + 1] * ax
    return top * (1 - ay) + bottom * ay
