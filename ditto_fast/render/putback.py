"""Paste the generated 512x512 face crop back into a background frame with a feathered mask."""

from __future__ import annotations

import math
import warnings

import cv2
import numpy as np

try:  # the Cython kernel, built by `python setup.py build_ext --inplace`
    from ditto_fast.render import _blend
except ImportError:  # pragma: no cover - exercised by the fallback test via monkeypatch
    _blend = None

_warned_fallback = False


def feathered_mask(size: int = 512, inner: float = 0.9) -> np.ndarray:
    """Float32 [size,size] mask: 1 on the central `inner` fraction, linear ramps to 0 at the border, round corners."""
    n_inner = int(size * inner)
    lo = (size - n_inner) // 2          # first inner index
    hi = lo + n_inner                   # first index past the inner region
    idx = np.arange(size, dtype=np.float64)
    # normalised distance into the border band along one axis: 0 inside, 1 at the outermost pixel
    dist = np.zeros(size, dtype=np.float64)
    if lo > 1:
        dist[:lo] = (lo - 1 - idx[:lo]) / (lo - 1)
    elif lo == 1:
        dist[:1] = 1.0
    n_hi = size - hi
    if n_hi > 1:
        dist[hi:] = (idx[hi:] - hi) / (n_hi - 1)
    elif n_hi == 1:
        dist[hi:] = 1.0
    radial = np.hypot(dist[:, None], dist[None, :])     # [size, size]; corners become quarter circles
    return (1.0 - np.clip(radial, 0.0, 1.0)).astype(np.float32)


def crop_bbox(M_c2o: np.ndarray, dsize: int, frame_hw: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1) of the frame region the warped crop can touch (clipped), or None if off-frame."""
    h, w = frame_hw
    # one pixel beyond the crop on each side covers bilinear spill-over
    corners = np.array([[-1, -1, 1], [dsize, -1, 1], [-1, dsize, 1], [dsize, dsize, 1]], dtype=np.float64)
    pts = corners @ np.asarray(M_c2o, dtype=np.float64)[:2].T      # [4, 2] (x, y) in the frame
    x0 = max(0, int(math.floor(pts[:, 0].min())))
    y0 = max(0, int(math.floor(pts[:, 1].min())))
    x1 = min(w, int(math.ceil(pts[:, 0].max())) + 1)
    y1 = min(h, int(math.ceil(pts[:, 1].max())) + 1)
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1


def _blend_numpy(crop: np.ndarray, mask: np.ndarray, frame: np.ndarray, y0: int, x0: int) -> None:
    """Numpy version of the kernel: frame region <- round(mask*crop + (1-mask)*frame), in place."""
    h, w = crop.shape[:2]
    bg = frame[y0:y0 + h, x0:x0 + w]
    if mask.dtype == np.uint8:
        m = mask.astype(np.float32)[..., None] / np.float32(255.0)
    else:
        m = mask.astype(np.float32, copy=False)[..., None]
    bgf = bg.astype(np.float32)
    out = bgf + m * (crop.astype(np.float32) - bgf) + np.float32(0.5)
    np.clip(out, 0.0, 255.0, out=out)
    bg[...] = out.astype(np.uint8)


def blend_roi(crop: np.ndarray, mask: np.ndarray, frame: np.ndarray, y0: int, x0: int,
              use_kernel: bool = True) -> None:
    """Blend crop [h,w,3] uint8 with mask [h,w] (float32 in [0,1], or uint8) into frame[y0:y0+h, x0:x0+w] in place."""
    global _warned_fallback
    if use_kernel and _blend is not None:
        if mask.dtype == np.uint8:
            _blend.blend_roi_u8(crop, np.ascontiguousarray(mask), frame, y0, x0)
        else:
            _blend.blend_roi_f32(crop, np.ascontiguousarray(mask, dtype=np.float32), frame, y0, x0)
        return
    if use_kernel and not _warned_fallback:
        _warned_fallback = True
        warnings.warn("ditto_fast.render._blend is not built; using the slower numpy putback "
                      "(build it with `python setup.py build_ext --inplace`)", RuntimeWarning, stacklevel=3)
    _blend_numpy(crop, mask, frame, y0, x0)


class Putback:
    """Paste a [dsize,dsize,3] crop into a frame via M_c2o, blending with a feathered mask inside the crop's bbox.

    With the Cython kernel the mask is sampled per pixel inside the kernel (only its feathered band
    is interpolated); without it the mask is warped with OpenCV and blended with numpy.
    """

    def __init__(self, dsize: int = 512, use_kernel: bool = True):
        self.dsize = dsize
        self.use_kernel = use_kernel
        self.mask = feathered_mask(dsize)          # [dsize, dsize] float32
        ones = np.flatnonzero(self.mask[dsize // 2] == 1.0)
        self._inner = (int(ones[0]), int(ones[-1]))     # mask[lo..hi, lo..hi] == 1
        lo, hi = self._inner
        assert np.all(self.mask[lo:hi + 1, lo:hi + 1] == 1.0)
        # the warped mask is reused while M_c2o repeats (image avatars; numpy path only)
        self._last_key: tuple | None = None
        self._last_mask_roi: np.ndarray | None = None

    def _warped_mask(self, M_roi: np.ndarray, roi_wh: tuple[int, int]) -> np.ndarray:
        """The mask warped into the region, [h, w] float32 (cached for a repeated matrix)."""
        key = (M_roi.tobytes(), roi_wh)
        if key != self._last_key:
            self._last_mask_roi = cv2.warpAffine(self.mask, M_roi, roi_wh, flags=cv2.INTER_LINEAR,
                                                 borderMode=cv2.BORDER_CONSTANT, borderValue=0)
            self._last_key = key
        return self._last_mask_roi

    def __call__(self, frame_bg: np.ndarray, crop: np.ndarray, M_c2o: np.ndarray) -> np.ndarray:
        """frame_bg [H,W,3] uint8 (blended in place and returned; copied first if not writable C-contiguous),
        crop [dsize,dsize,3] uint8, M_c2o [3,3] crop->frame."""
        if frame_bg.dtype != np.uint8 or frame_bg.ndim != 3 or frame_bg.shape[2] != 3:
            raise ValueError(f"frame_bg must be uint8 [H,W,3], got {frame_bg.dtype} {frame_bg.shape}")
        if crop.dtype != np.uint8 or crop.shape != (self.dsize, self.dsize, 3):
            raise ValueError(f"crop must be uint8 [{self.dsize},{self.dsize},3], got {crop.dtype} {crop.shape}")
        if not (frame_bg.flags.writeable and frame_bg.flags.c_contiguous):
            frame_bg = np.array(frame_bg, copy=True, order="C")
        M_c2o = np.asarray(M_c2o, dtype=np.float64)
        bbox = crop_bbox(M_c2o, self.dsize, frame_bg.shape[:2])
        if bbox is None:
            return frame_bg
        x0, y0, x1, y1 = bbox
        roi_wh = (x1 - x0, y1 - y0)
        M_roi = M_c2o[:2].copy()             # crop -> region: the frame matrix shifted by the bbox origin
        M_roi[0, 2] -= x0
        M_roi[1, 2] -= y0
        crop_roi = cv2.warpAffine(np.ascontiguousarray(crop), M_roi, roi_wh, flags=cv2.INTER_LINEAR,
                                  borderMode=cv2.BORDER_CONSTANT, borderValue=0)   # [h, w, 3] uint8
        if self.use_kernel and _blend is not None:
            inv = np.ascontiguousarray(cv2.invertAffineTransform(M_roi), dtype=np.float64).ravel()  # region -> crop
            _blend.blend_feathered(crop_roi, self.mask, inv, self._inner[0], self._inner[1], frame_bg, y0, x0)
            return frame_bg
        blend_roi(crop_roi, self._warped_mask(M_roi, roi_wh), frame_bg, y0, x0, use_kernel=self.use_kernel)
        return frame_bg
