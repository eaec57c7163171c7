"""4:2:0 video frames kept as YUV and turned into RGB only where they are looked at.

Registration needs RGB only around the face (the mesh crop, the 512 crop) and, now and then, the
whole frame (face detection). Taking frames from ffmpeg as yuv420p halves the bytes through the
pipe and skips a full-frame colour conversion; the regions are converted here the way ffmpeg's own
yuv420p -> rgb24 conversion does it (the stream's colour matrix, limited range, each chroma sample
covering 2x2 pixels), to within 3 levels, so these pixels match what the plate decodes to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import cv2
import numpy as np

# colour matrices by ffmpeg's `scale` filter name: (Kr, Kb); and the colorspace tag that names each
_KR_KB = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722), "bt2020": (0.2627, 0.0593),
          "smpte240m": (0.212, 0.087), "fcc": (0.30, 0.11)}
COLORSPACE_TAG = {"bt601": "smpte170m", "bt709": "bt709", "bt2020": "bt2020nc", "smpte240m": "smpte240m",
                  "fcc": "fcc"}
# ffmpeg's integer conversion truncates where cv2.transform rounds: with this offset the levels match
# ffmpeg's to within 3 (mean 0.7) on BT.601 and BT.709 sources, and 16..235 grey still maps to 0..255
_FFMPEG_BIAS = -0.3    # not -0.5: cv2.transform's fixed point would then turn 235 into 254


def matrix_for_tag(colorspace: str | None) -> str:
    """The matrix ffmpeg converts with for a stream's colorspace tag: its own for BT.709, BT.2020,
    SMPTE 240M and FCC; BT.601 for the rest (BT.470BG, SMPTE 170M, untagged, RGB)."""
    tag = (colorspace or "").lower()
    if tag.startswith("bt2020"):
        return "bt2020"
    return tag if tag in ("bt709", "smpte240m", "fcc") else "bt601"


def yuv_to_rgb_matrix(matrix: str = "bt601", full_range: bool = False) -> np.ndarray:
    """[3, 4] float32 affine map from (Y, U, V) levels to (R, G, B) levels, for cv2.transform."""
    kr, kb = _KR_KB[matrix]
    kg = 1.0 - kr - kb
    ys, cs, y0 = (1.0, 1.0, 0.0) if full_range else (255 / 219, 255 / 224, 16.0)
    m = np.array([[ys, 0.0, cs * 2 * (1 - kr)],
                  [ys, -cs * 2 * (1 - kb) * kb / kg, -cs * 2 * (1 - kr) * kr / kg],
                  [ys, cs * 2 * (1 - kb), 0.0]])
    off = -m @ np.array([y0, 128.0, 128.0]) + _FFMPEG_BIAS
    return np.hstack([m, off[:, None]]).astype(np.float32)


def rgb_to_yuv_matrix(matrix: str = "bt709") -> np.ndarray:
    """[3, 4] float32 affine map from (R, G, B) levels to limited-range (Y, U, V) levels, for cv2.transform
    (which rounds): the conversion ffmpeg makes for out_range=tv with that matrix."""
    kr, kb = _KR_KB[matrix]
    kg = 1.0 - kr - kb
    luma = np.array([kr, kg, kb])
    m = np.stack([luma * 219 / 255,
                  (np.array([0.0, 0.0, 1.0]) - luma) / (2 * (1 - kb)) * 224 / 255,
                  (np.array([1.0, 0.0, 0.0]) - luma) / (2 * (1 - kr)) * 224 / 255])
    return np.hstack([m, np.array([[16.0], [128.0], [128.0]])]).astype(np.float32)


@dataclass(frozen=True)
class Layout:
    """A planar limited-range YUV frame format as ffmpeg names it: 4:2:0 or 4:2:2, 8 or 10 bits. A frame is one
    array [H + 2 * H/cv * 1/2, W] (cv: the chroma's vertical subsampling): Y, then U and V, uint8 or uint16."""

    pix_fmt: str

    def __post_init__(self) -> None:
        if self.pix_fmt not in LAYOUTS:
            raise ValueError(f"unsupported plane layout {self.pix_fmt!r}; one of {', '.join(LAYOUTS)}")

    @property
    def bits(self) -> int:
        return 10 if self.pix_fmt.endswith("10le") else 8

    @property
    def chroma_rows(self) -> int:
        """Luma rows per chroma row: 2 for 4:2:0, 1 for 4:2:2 (chroma columns are always half)."""
        return 2 if self.pix_fmt.startswith("yuv420") else 1

    @property
    def dtype(self) -> type:
        return np.uint16 if self.bits > 8 else np.uint8

    @property
    def scale(self) -> int:
        """Code values per 8-bit level (limited range: 64..940 is 16..235 times 4)."""
        return 1 << (self.bits - 8)

    def shape(self, width: int, height: int) -> tuple[int, int]:
        """The frame array's shape for a picture of width x height."""
        return height + height // self.chroma_rows, width

    def planes(self, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Views of a frame: luma [1, H, W] and chroma [2, H/cv, W/2] (U, V)."""
        cv = self.chroma_rows
        h, w = frame.shape[0] * cv // (cv + 1), frame.shape[1]
        return frame[:h].reshape(1, h, w), frame[h:].reshape(2, h // cv, w // 2)


LAYOUTS = ("yuv420p", "yuv422p", "yuv420p10le", "yuv422p10le")
I420 = Layout("yuv420p")


def layout_for(pix_fmt: str | None) -> Layout:
    """The plate layout that keeps a source's pixel format: its chroma up to 4:2:2 (4:4:4 and RGB become 4:2:2)
    and its bit depth up to 10 (more becomes 10); 8-bit 4:2:0 and anything unknown stay yuv420p."""
    fmt = (pix_fmt or "").lower()
    depth = re.search(r"(?:p|gray|rgb|bgr|gbrp?|rgba|bgra|x2rgb10|x2bgr10)(\d{1,2})(?:le|be)$", fmt)
    deep = bool(depth) and int(depth.group(1)) > 8 or fmt in ("rgb48le", "rgb48be", "p010le", "p210le")
    full_chroma = any(k in fmt for k in ("422", "444", "rgb", "bgr", "gbr", "p210", "nv16", "nv20", "y210"))
    return Layout(("yuv422p" if full_chroma else "yuv420p") + ("10le" if deep else ""))


def i420_planes(frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Views of a yuv420p frame [H * 3 / 2, W] uint8: luma [1, H, W] and chroma [2, H/2, W/2] (U, V)."""
    return I420.planes(frame)


def rgb_to_i420(rgb: np.ndarray, matrix: str = "bt709") -> np.ndarray:
    """An RGB image [H, W, 3] uint8 (even H, W) as a limited-range yuv420p frame [H * 3 / 2, W] uint8; each
    chroma sample is the mean of its 2x2 pixels."""
    h, w = rgb.shape[:2]
    yuv = cv2.transform(np.ascontiguousarray(rgb), rgb_to_yuv_matrix(matrix))
    out = np.empty((h * 3 // 2, w), np.uint8)
    luma, chroma = i420_planes(out)
    luma[0] = yuv[..., 0]
    uv = cv2.resize(yuv[..., 1:], (w // 2, h // 2), interpolation=cv2.INTER_AREA)
    chroma[0], chroma[1] = uv[..., 0], uv[..., 1]
    return out


class YuvFrame:
    """One I420 frame ([H * 3 / 2, W] uint8: Y, then U and V at half size) that gives RGB by region.

    The buffer is not copied: the frame is valid as long as the buffer holds it.
    """

    def __init__(self, buf: np.ndarray, width: int, height: int, matrix: str = "bt601",
                 full_range: bool = False) -> None:
        if width % 2 or height % 2 or buf.shape != (height * 3 // 2, width) or buf.dtype != np.uint8:
            raise ValueError(f"an I420 buffer for {width}x{height} must be uint8 [{height * 3 // 2}, {width}]")
        self.width, self.height = width, height
        self.buffer = buf
        self.y = buf[:height]                                              # [H, W]
        chroma = buf[height:].reshape(2, height // 2, width // 2)          # U, V: [H/2, W/2] each
        self.u, self.v = chroma[0], chroma[1]
        self.matrix = yuv_to_rgb_matrix(matrix, full_range)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(H, W, 3), the shape of the RGB frame."""
        return self.height, self.width, 3

    def region(self, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
        """RGB pixels [y1 - y0, x1 - x0, 3] uint8 of the region; it must lie inside the frame."""
        if not (0 <= x0 <= x1 <= self.width and 0 <= y0 <= y1 <= self.height):
            raise ValueError(f"region ({x0}, {y0})-({x1}, {y1}) is outside the {self.width}x{self.height} frame")
        xa, ya, xb, yb = x0 & ~1, y0 & ~1, x1 + (x1 & 1), y1 + (y1 & 1)     # whole chroma samples
        if xb <= xa or yb <= ya:
            return np.zeros((y1 - y0, x1 - x0, 3), np.uint8)
        size = (xb - xa, yb - ya)
        u = cv2.resize(self.u[ya // 2:yb // 2, xa // 2:xb // 2], size, interpolation=cv2.INTER_NEAREST)
        v = cv2.resize(self.v[ya // 2:yb // 2, xa // 2:xb // 2], size, interpolation=cv2.INTER_NEAREST)
        rgb = cv2.transform(cv2.merge([self.y[ya:yb, xa:xb], u, v]), self.matrix)
        return rgb[y0 - ya:y1 - ya, x0 - xa:x1 - xa]

    def rgb(self) -> np.ndarray:
        """The whole frame as RGB [H, W, 3] uint8 (a new array)."""
        return self.region(0, 0, self.width, self.height)


def frame_region(frame: np.ndarray | YuvFrame, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    """RGB pixels of a region inside an RGB array [H, W, 3] or a YuvFrame (a view for an array)."""
    if isinstance(frame, YuvFrame):
        return frame.region(x0, y0, x1, y1)
    return frame[y0:y1, x0:x1]


def frame_rgb(frame: np.ndarray | YuvFrame) -> np.ndarray:
    """The whole frame as an RGB array [H, W, 3] uint8."""
    return frame.rgb() if isinstance(frame, YuvFrame) else frame


def planes_to_rgb(frame: np.ndarray, layout: Layout, matrix: str = "bt709") -> np.ndarray:
    """A frame in `layout` (limited range, `matrix`: a plate's planes are BT.709) as RGB [H, W, 3] uint8, each chroma
    sample covering its 2x1 or 2x2 pixels, as ffmpeg's conversion does."""
    luma, chroma = layout.planes(frame)
    h, w = luma.shape[1:]
    y = luma[0]
    u = cv2.resize(chroma[0], (w, h), interpolation=cv2.INTER_NEAREST)
    v = cv2.resize(chroma[1], (w, h), interpolation=cv2.INTER_NEAREST)
    if layout.bits > 8:                 # 10-bit codes to 8-bit levels (the matrix works in levels)
        yuv = cv2.merge([y, u, v]).astype(np.float32) * (1.0 / layout.scale)
        return np.clip(cv2.transform(yuv, yuv_to_rgb_matrix(matrix)) + 0.5, 0, 255).astype(np.uint8)
    return cv2.transform(cv2.merge([y, u, v]), yuv_to_rgb_matrix(matrix))
