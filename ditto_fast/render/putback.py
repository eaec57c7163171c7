"""Paste the generated face crop into a plate frame's YUV planes, plane by plane, inside the face box only.

The planes are the plate's own (yuv.Layout: 4:2:0 or 4:2:2, 8 or 10 bits). The 512 RGB crop is the only thing
converted (to the output's limited-range YUV at the planes' depth); its chroma is averaged over the pixels
each chroma sample covers (2x2, or 2x1 for 4:2:2) and warped at that size. Everything outside the (even-aligned) box the crop
can touch is the plate's own bytes, untouched. A feathered mask blends the crop's border into the plate.
"""

from __future__ import annotations

import math
import warnings

import cv2
import numpy as np

from ditto_fast.core.config import BLENDS
from ditto_fast.media.yuv import I420, Layout, rgb_to_yuv_matrix
from ditto_fast.render.face_mask import FaceMask
from ditto_fast.render.seam import GainMatch, SeamMatch

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


def crop_bbox(M_c2o: np.ndarray, dsize: int | tuple[int, int], frame_hw: tuple[int, int]
              ) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1) of the frame region the warped crop (dsize square, or (width, height)) can touch (clipped),
    or None if off-frame."""
    h, w = frame_hw
    cw, chh = (dsize, dsize) if isinstance(dsize, int) else dsize
    # one pixel beyond the crop on each side covers bilinear spill-over
    corners = np.array([[-1, -1, 1], [cw, -1, 1], [-1, chh, 1], [cw, chh, 1]], dtype=np.float64)
    pts = corners @ np.asarray(M_c2o, dtype=np.float64)[:2].T      # [4, 2] (x, y) in the frame
    x0 = max(0, int(math.floor(pts[:, 0].min())))
    y0 = max(0, int(math.floor(pts[:, 1].min())))
    x1 = min(w, int(math.ceil(pts[:, 0].max())) + 1)
    y1 = min(h, int(math.ceil(pts[:, 1].max())) + 1)
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1


def chroma_to_luma(layout: Layout) -> np.ndarray:
    """3x3 map from a chroma sample's (x, y) to the luma position it stands for: chroma sample c of a 4:2:0
    plane sits at 2c + 0.5 (it covers 2x2 pixels); 4:2:2 rows are full height (2x1 pixels)."""
    rows = layout.chroma_rows
    return np.array([[2.0, 0.0, 0.5], [0.0, rows, 0.5 * (rows - 1)], [0.0, 0.0, 1.0]])


def _affine3(m: np.ndarray) -> np.ndarray:
    """A 2x3 affine matrix as 3x3."""
    return np.vstack([m[:2], [0.0, 0.0, 1.0]])


def _blend_planes_numpy(src: np.ndarray, mask: np.ndarray, planes: np.ndarray, y0: int, x0: int) -> None:
    """planes[c, y0:y0+h, x0:x0+w] <- round(mask*src[..., c] + (1-mask)*planes), in place."""
    h, w = mask.shape
    bg = planes[:, y0:y0 + h, x0:x0 + w].astype(np.float32)
    fg = np.moveaxis(src, -1, 0).astype(np.float32)
    out = bg + mask[None] * (fg - bg) + np.float32(0.5)
    np.clip(out, 0.0, float(np.iinfo(planes.dtype).max), out=out)
    planes[:, y0:y0 + h, x0:x0 + w] = out.astype(planes.dtype)


class YuvPutback:
    """Blend a [dsize, dsize, 3] RGB crop into a planar frame in `layout` (yuv.Layout.shape) in place, via M_c2o.

    The Cython kernel samples the feathered mask per pixel (luma at each pixel, chroma at each 2x2 block's
    centre); the numpy fallback (used, with a warning, when the kernel is not built) warps it with OpenCV.
    """

    def __init__(self, dsize: int = 512, matrix: str = "bt709", use_kernel: bool = True, layout: Layout = I420,
                 blend: str = "feather"):
        global _warned_fallback
        if dsize % 2:
            raise ValueError(f"the crop size must be even, got {dsize}")
        self.dsize = dsize
        built = hasattr(_blend, "seam_correction")            # False for no build or a stale one
        self.use_kernel = use_kernel and built
        if use_kernel and not built and not _warned_fallback:
            _warned_fallback = True
            warnings.warn("ditto_fast.render._blend is not built (or is out of date); using the slower numpy putback "
                          "(build it with `python setup.py build_ext --inplace`)", RuntimeWarning, stacklevel=2)
        self.mask = feathered_mask(dsize)                              # [dsize, dsize] float32
        ones = np.flatnonzero(self.mask[dsize // 2] == 1.0)
        self._inner = (int(ones[0]), int(ones[-1]))
        self.layout = layout
        self.to_yuv = rgb_to_yuv_matrix(matrix) * np.float32(layout.scale)       # [3, 4], the planes' code values
        self._c2l = chroma_to_luma(layout)
        self._l2c = np.linalg.inv(self._c2l)
        self.top = float((1 << layout.bits) - 1)
        if blend not in BLENDS:
            raise ValueError(f"blend must be one of {', '.join(BLENDS)}, got {blend!r}")
        self.blend = blend
        if blend == "seamless":
            self.face_mask = FaceMask(dsize, square=self.mask)
            self.seam = SeamMatch(layout, dsize, kernel=_blend.seam_correction if self.use_kernel else None)
            self.gain = GainMatch(layout, self.to_yuv)
            self._inner_cells = self.face_mask.inner_cells()

    def box(self, M_c2o: np.ndarray, frame_hw: tuple[int, int], size: tuple[int, int] | None = None
            ) -> tuple[int, int, int, int] | None:
        """(x0, y0, x1, y1), all even, of the only pixels a paste with M_c2o may change (of the crop, or of a part
        of it `size` (width, height) that M_c2o places); None if off-frame."""
        bbox = crop_bbox(np.asarray(M_c2o, np.float64), size or self.dsize, frame_hw)
        if bbox is None:
            return None
        x0, y0, x1, y1 = bbox
        return x0 & ~1, y0 & ~1, x1 + (x1 & 1), y1 + (y1 & 1)

    def __call__(self, frame: np.ndarray, crop: np.ndarray, M_c2o: np.ndarray, x_s: np.ndarray | None = None,
                 x_d: np.ndarray | None = None, cut: bool = False) -> np.ndarray:
        """Paste `crop` (RGB uint8) into `frame` (planes in the putback's layout, writable) and return the frame.
        Seamless: `x_s`, `x_d` are the frame's source and driven keypoints [21, 3] (the mask follows the face they
        move; None: the face where the crop rule puts it), `cut` a plate jump (the running means restart)."""
        layout = self.layout
        rows = layout.chroma_rows                           # luma rows per chroma row
        if frame.dtype != layout.dtype or frame.ndim != 2 or frame.shape[0] % (rows + 1) or \
                not frame.flags.c_contiguous:
            raise ValueError(f"frame must be a C-contiguous {layout.pix_fmt} {np.dtype(layout.dtype)} "
                             f"[H*{rows + 1}/{rows}, W], got {frame.dtype} {frame.shape}")
        if crop.dtype != np.uint8 or crop.shape != (self.dsize, self.dsize, 3):
            raise ValueError(f"crop must be uint8 [{self.dsize},{self.dsize},3], got {crop.dtype} {crop.shape}")
        luma, chroma = layout.planes(frame)
        box = self.box(M_c2o, luma.shape[1:])
        if box is None:
            return frame
        crop = np.ascontiguousarray(crop)
        source = _affine3(np.asarray(M_c2o, np.float64))    # crop pixel -> frame pixel
        if self.blend == "seamless":
            # the corrected part of the crop the face mask covers and its offset in the crop, the mask grid; only
            # the box that part can touch is pasted
            planes = self._seamless_planes(crop, M_c2o, (luma, chroma), x_s, x_d, cut)
            if planes is None:
                return frame
            (luma_crop, uv), offset, mask, inner, outer, to_mask = planes
            shift = np.array([[1.0, 0.0, offset[0]], [0.0, 1.0, offset[1]], [0.0, 0.0, 1.0]])
            source, to_mask = source @ shift, to_mask @ shift
            box = self.box(source, luma.shape[1:], luma_crop.shape[::-1])
            if box is None:
                return frame
        else:
            (luma_crop, uv), mask, (lo, hi), to_mask = self._crop_planes(crop), self.mask, self._inner, np.eye(3)
            inner, outer = np.array([lo, hi, lo, hi], np.float64), np.array([-1.0, self.dsize, -1.0, self.dsize])
        x0, y0, x1, y1 = box
        w, h = x1 - x0, y1 - y0
        roi = source.copy()                                 # (part of the) crop -> region (luma pixels)
        roi[0, 2] -= x0
        roi[1, 2] -= y0
        roi_c = self._l2c @ roi @ self._c2l                 # crop chroma -> region chroma
        # region luma pixel -> crop pixel (OpenCV's closed form: numpy's LAPACK inverse woke an OpenBLAS thread that
        # then spun beside every frame's render, 15 ms of CPU a frame), then -> mask coordinates
        crop_of_luma = _affine3(cv2.invertAffineTransform(roi[:2]))
        mask_of_luma = to_mask @ crop_of_luma
        mask_of_chroma = mask_of_luma @ self._c2l           # region chroma sample -> mask coordinates
        flags = dict(flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
        y_roi = cv2.warpAffine(luma_crop, roi[:2], (w, h), **flags)[..., None]
        uv_roi = np.ascontiguousarray(cv2.warpAffine(uv, roi_c[:2], (w // 2, h // rows), **flags))
        if self.use_kernel:
            _blend.blend_masked_planes(y_roi, mask, _flat(mask_of_luma), inner, outer, luma, y0, x0)
            _blend.blend_masked_planes(uv_roi, mask, _flat(mask_of_chroma), inner, outer, chroma, y0 // rows, x0 // 2)
            return frame
        m_y = cv2.warpAffine(mask, cv2.invertAffineTransform(mask_of_luma[:2]), (w, h), **flags)
        m_c = cv2.warpAffine(mask, cv2.invertAffineTransform(mask_of_chroma[:2]), (w // 2, h // rows), **flags)
        _blend_planes_numpy(y_roi, m_y, luma, y0, x0)
        _blend_planes_numpy(uv_roi, m_c, chroma, y0 // rows, x0 // 2)
        return frame

    def _crop_planes(self, crop: np.ndarray, to_yuv: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The crop's (or an even-sized part's) luma [h, w] and chroma [h/cv, w/2, 2], averaged over the pixels a chroma
        sample covers (the conversion is linear: the same as averaging converted chroma), at the planes' depth;
        `to_yuv` a [3, 4] conversion other than the putback's."""
        to_yuv = self.to_yuv if to_yuv is None else to_yuv
        half = (crop.shape[1] // 2, crop.shape[0] // self.layout.chroma_rows)
        if self.layout.bits == 8:
            return (cv2.transform(crop, to_yuv[:1]),
                    cv2.transform(cv2.resize(crop, half, interpolation=cv2.INTER_AREA), to_yuv[1:]))
        top = self.top
        rgb = crop.astype(np.float32)
        luma = cv2.transform(rgb, to_yuv[:1])
        uv = cv2.transform(cv2.resize(rgb, half, interpolation=cv2.INTER_AREA), to_yuv[1:])
        return tuple(np.clip(np.rint(p), 0, top).astype(self.layout.dtype) for p in (luma, uv))

    def _seamless_planes(self, crop: np.ndarray, M_c2o: np.ndarray, planes: tuple, x_s: np.ndarray | None,
                         x_d: np.ndarray | None, cut: bool) -> tuple | None:
        """The seamless paste's inputs: the part of the crop the face mask covers as planes with the seam's colour
        correction added (seam.py) and its offset (x, y) in the crop, the face mask grid [G, G] with the rectangles
        (grid cells) where it is 1 and outside which 0, and the map from crop pixels to grid cells; None for an
        empty mask."""
        if cut:
            self.face_mask.reset()
            self.seam.reset()
            self.gain.reset()
        if x_s is None or x_d is None:
            x_s = x_d = np.zeros((1, 3))            # degenerate: the face where the crop rule puts it
        d, rows = self.dsize, self.layout.chroma_rows
        grid = self.face_mask(x_s, x_d)                                                    # [G, G]
        g = grid.shape[0]
        # the crop at each cell's centre (its four central pixels), the plate's bilinear sample's footprint: the
        # cell's mean against the plate's point differed by 6 levels (std) where hair or an edge crosses it
        n, a = d // g, d // g // 2 - 1
        small = (crop[a::n, a::n].astype(np.float32) + crop[a + 1::n, a::n] + crop[a::n, a + 1::n]
                 + crop[a + 1::n, a + 1::n]) * np.float32(0.25)
        gains = self.gain(grid, small, planes, M_c2o, d)                                   # R, G, B; 1: none
        to_yuv = self.to_yuv if (gains == 1.0).all() else self.to_yuv * np.append(gains, 1.0).astype(np.float32)
        corr = self.seam(grid, cv2.transform(small, to_yuv), planes, M_c2o)                 # [K, K, 3]
        outer = _support_cells(grid)
        if outer[1] < outer[0]:
            return None
        cx0, cy0, cx1, cy1 = _support_pixels(outer, g, d)
        # the crop's planes as the feather pastes them, the correction added (rounded, saturated) at their depth
        luma, uv = self._crop_planes(crop[cy0:cy1, cx0:cx1], to_yuv)
        depth = cv2.CV_8U if self.layout.bits == 8 else cv2.CV_16U
        up = _upsampled(corr[..., 0], (d, d), (cx0, cy0, cx1, cy1))
        up_uv = _upsampled(corr[..., 1:], (d // 2, d // rows), (cx0 // 2, cy0 // rows, cx1 // 2, cy1 // rows))
        luma = cv2.add(luma, np.ascontiguousarray(up), dtype=depth)
        uv = cv2.add(uv, np.ascontiguousarray(up_uv), dtype=depth)
        if self.layout.bits > 8:
            np.minimum(luma, int(self.top), out=luma)
            np.minimum(uv, int(self.top), out=uv)
        return (luma, uv), (cx0, cy0), grid, self._inner_cells, outer, _crop_to_grid(g, d)


def _upsampled(grid: np.ndarray, size: tuple[int, int], part: tuple[int, int, int, int]) -> np.ndarray:
    """grid [K, K(, C)] resized bilinearly to `size` (w, h; multiples of K) as cv2.resize does, cut to `part` (x0, y0,
    x1, y1): the same values, from a resize of only the cells the part needs."""
    k = grid.shape[0]
    (w, h), (x0, y0, x1, y1) = size, part
    (ax, bx), (ay, by) = _cells(x0, x1, w // k, k), _cells(y0, y1, h // k, k)
    up = cv2.resize(grid[ay:by, ax:bx], ((bx - ax) * (w // k), (by - ay) * (h // k)), interpolation=cv2.INTER_LINEAR)
    ox, oy = ax * (w // k), ay * (h // k)
    return up[y0 - oy:y1 - oy, x0 - ox:x1 - ox]


def _cells(lo: int, hi: int, scale: int, k: int) -> tuple[int, int]:
    """The cells [a, b) a bilinear upsampling by `scale` reads for output pixels lo..hi-1 (cell of pixel x: (x + 0.5)
    / scale - 0.5 and the next)."""
    return (max(0, math.floor((lo + 0.5) / scale - 0.5)),
            min(k, math.floor((hi - 0.5) / scale - 0.5) + 2))


def _flat(m: np.ndarray) -> np.ndarray:
    """The top two rows of an affine matrix as the kernel takes them: 6 float64 values, row-major."""
    return np.ascontiguousarray(np.asarray(m, np.float64)[:2]).ravel()


def _crop_to_grid(n: int, dsize: int) -> np.ndarray:
    """3x3 map from a crop pixel to the cell coordinates of an n x n grid over the crop, as cv2.resize places them
    (crop pixel j is cell (j + 0.5) * n / dsize - 0.5)."""
    s = n / dsize
    return np.array([[s, 0.0, 0.5 * s - 0.5], [0.0, s, 0.5 * s - 0.5], [0.0, 0.0, 1.0]])


def _support_pixels(outer: np.ndarray, g: int, dsize: int) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1), even, of the crop pixels a mask whose (non-empty) support is `outer` (grid cells) needs,
    with a pixel beside them for the warp's bilinear samples."""
    cell = dsize / g
    lo = np.floor((outer[[0, 2]] + 0.5) * cell - 0.5) - 2
    hi = np.ceil((outer[[1, 3]] + 0.5) * cell - 0.5) + 3
    x0, y0 = (max(0, int(v)) & ~1 for v in lo)
    x1, y1 = (min(dsize, int(v) + (int(v) & 1)) for v in hi)
    return x0, y0, x1, y1


def _support_cells(grid: np.ndarray) -> np.ndarray:
    """(x0, x1, y0, y1) in grid coordinates outside which the grid sampled bilinearly is 0."""
    cols, rows = np.flatnonzero(grid.any(axis=0)), np.flatnonzero(grid.any(axis=1))
    if not len(cols):
        return np.array([0.0, -1.0, 0.0, -1.0])
    return np.array([cols[0] - 1.0, cols[-1] + 1.0, rows[0] - 1.0, rows[-1] + 1.0])
