"""OpenCV drawing for the previews: a light page, text, pictures fitted into boxes, time plots, PNG out.

Everything is drawn in BGR with OpenCV's own Hershey fonts, so the same inputs give the same pixels.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ditto_fast.core.errors import InputError
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.preview.paths import check_png_path

WIDTH = 1600                       # every preview is this wide
MARGIN = 16
PAGE = (246, 246, 246)             # BGR
INK = (40, 40, 40)
FAINT = (200, 200, 200)
FONT = cv2.FONT_HERSHEY_SIMPLEX
# series colours (BGR), picked to stay apart for colour-blind readers
BLUE, ORANGE, GREEN, RED, PURPLE, GREY = (178, 114, 0), (0, 159, 230), (115, 158, 0), (0, 94, 213), \
    (167, 121, 204), (150, 150, 150)


@dataclass(frozen=True)
class Box:
    """A rectangle on the page: left, top, width, height in pixels."""

    x: int
    y: int
    w: int
    h: int


def page(height: int, width: int = WIDTH) -> np.ndarray:
    """A blank page [height, width, 3] uint8 BGR."""
    img = np.empty((height, width, 3), np.uint8)
    img[:] = PAGE
    return img


def text(img: np.ndarray, s: str, x: int, y: int, scale: float = 0.5, colour: tuple[int, int, int] = INK,
         bold: bool = False) -> None:
    """Write `s` with its baseline's left end at (x, y)."""
    cv2.putText(img, s, (int(x), int(y)), FONT, scale, colour, 2 if bold else 1, cv2.LINE_AA)


def text_width(s: str, scale: float = 0.5, bold: bool = False) -> int:
    """Width in pixels of `s` as text() draws it."""
    return cv2.getTextSize(s, FONT, scale, 2 if bold else 1)[0][0]


def paste(img: np.ndarray, picture_rgb: np.ndarray, box: Box) -> float:
    """Paste an RGB picture resized to fill `box` exactly (the box has its aspect); returns the scale used."""
    h, w = picture_rgb.shape[:2]
    small = cv2.resize(picture_rgb, (box.w, box.h), interpolation=cv2.INTER_AREA)
    img[box.y:box.y + box.h, box.x:box.x + box.w] = small[..., ::-1]
    return box.w / w


def nice_step(span: float, target: int) -> float:
    """A tick step of the form 1, 2 or 5 x 10^k giving about `target` ticks over `span`."""
    raw = max(span, 1e-9) / max(1, target)
    base = 10 ** np.floor(np.log10(raw))
    return float(next(m * base for m in (1, 2, 5, 10) if m * base >= raw))


class TimePlot:
    """A plot panel over x in [0, x_max]: frame, grid, y ticks, a label, lines, marks and shaded spans."""

    def __init__(self, img: np.ndarray, box: Box, x_max: float, y_lo: float, y_hi: float, label: str):
        self.img, self.box, self.label = img, box, label
        self.x_max = max(float(x_max), 1e-9)
        if not y_hi > y_lo:
            y_lo, y_hi = y_lo - 1.0, y_lo + 1.0
        self.y_lo, self.y_hi = float(y_lo), float(y_hi)
        self.left = box.x + 56                            # room for the y tick labels
        self.right = box.x + box.w - 8
        self.top, self.bottom = box.y + 20, box.y + box.h
        cv2.rectangle(img, (self.left, self.top), (self.right, self.bottom), FAINT, 1)
        text(img, label, self.left, box.y + 14, 0.5, INK, bold=True)
        step = nice_step(self.y_hi - self.y_lo, 3)
        for j in range(int(np.ceil(self.y_lo / step)), int(np.floor(self.y_hi / step)) + 1):
            v = j * step
            y = int(self.py(v))
            cv2.line(img, (self.left, y), (self.right, y), FAINT, 1)
            text(img, f"{v:.4g}", box.x, y + 4, 0.4)

    def px(self, x: float | np.ndarray) -> np.ndarray:
        """Page column(s) of x."""
        return np.round(self.left + np.asarray(x, np.float64) / self.x_max * (self.right - self.left)).astype(np.int32)

    def py(self, y: float | np.ndarray) -> np.ndarray:
        """Page row(s) of y (clipped to the panel)."""
        frac = (np.asarray(y, np.float64) - self.y_lo) / (self.y_hi - self.y_lo)
        return np.round(self.bottom - np.clip(frac, 0, 1) * (self.bottom - self.top)).astype(np.int32)

    def x_axis(self, ticks: np.ndarray, labels: list[str], caption: str) -> None:
        """Tick marks and labels under the panel at x = ticks, and a caption at the right end."""
        for x, s in zip(ticks, labels):
            if x > self.x_max * (1 + 1e-9):
                continue
            c = int(self.px(x))
            cv2.line(self.img, (c, self.bottom), (c, self.bottom + 4), INK, 1)
            text(self.img, s, c - text_width(s, 0.4) // 2, self.bottom + 17, 0.4)
        text(self.img, caption, self.right - text_width(caption, 0.4), self.bottom + 32, 0.4)

    def line(self, x: np.ndarray, y: np.ndarray, colour: tuple[int, int, int], thickness: int = 2) -> None:
        """A series; a single point is drawn as a dot."""
        pts = np.stack([self.px(x), self.py(y)], -1)
        if len(pts) == 1:
            cv2.circle(self.img, tuple(int(v) for v in pts[0]), 3, colour, -1, cv2.LINE_AA)
        elif len(pts):
            cv2.polylines(self.img, [pts.reshape(-1, 1, 2)], False, colour, thickness, cv2.LINE_AA)

    def hline(self, y: float, colour: tuple[int, int, int], label: str = "") -> None:
        """A dashed horizontal line at y, labelled at its right end."""
        r = int(self.py(y))
        for x0 in range(self.left, self.right, 12):
            cv2.line(self.img, (x0, r), (min(x0 + 6, self.right), r), colour, 1)
        if label:
            text(self.img, label, self.right - text_width(label, 0.4) - 4, r - 4, 0.4, colour)

    def vmark(self, x: float, colour: tuple[int, int, int] = GREY) -> None:
        """A thin vertical line at x across the panel."""
        c = int(self.px(x))
        cv2.line(self.img, (c, self.top + 1), (c, self.bottom - 1), colour, 1)

    def spans(self, mask: np.ndarray, colour: tuple[int, int, int]) -> None:
        """Shade the columns of the x positions (0, 1, ..) where `mask` is true, lightly."""
        on = np.flatnonzero(np.asarray(mask))
        if on.size == 0:
            return
        region = self.img[self.top + 1:self.bottom, :]
        tint = np.asarray(colour, np.float32)
        for i in on:
            a, b = int(self.px(i - 0.5)), int(self.px(i + 0.5))
            a, b = max(a, self.left + 1), min(max(b, a + 1), self.right)
            region[:, a:b] = (region[:, a:b] * 0.75 + tint * 0.25).astype(np.uint8)

    def legend(self, items: list[tuple[str, tuple[int, int, int]]]) -> None:
        """Coloured names after the label."""
        x = self.left + text_width(self.label, 0.5, bold=True) + 24
        for name, colour in items:
            cv2.line(self.img, (x, self.box.y + 10), (x + 18, self.box.y + 10), colour, 3)
            text(self.img, name, x + 24, self.box.y + 14, 0.45)
            x += 24 + text_width(name, 0.45) + 20


def frame_ticks(n: int, target: int = 12) -> np.ndarray:
    """Frame numbers to label on an axis over frames 0..n-1."""
    step = max(1, int(nice_step(max(n - 1, 1), target)))
    return np.arange(0, max(n, 1), step)


def evenly_spaced(n: int, k: int) -> np.ndarray:
    """k frame numbers spread evenly over 0..n-1, first and last included (fewer when n < k)."""
    k = max(1, min(int(k), int(n)))
    return np.unique(np.round(np.linspace(0, n - 1, k)).astype(np.int64))


def write_png(img: np.ndarray, path: str | os.PathLike) -> Path:
    """Write a BGR page as PNG atomically (a temporary name in the same directory, then a rename)."""
    out = check_png_path(path)
    # zlib level 3: a tenth of level 9's time for a file about a tenth larger (a sheet is shown, not archived)
    ok, data = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise InputError(f"{out}: the preview could not be encoded")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.tobytes())
        give_usual_mode(tmp)
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{out}: cannot write the preview ({exc.strerror or exc})") from None
    return out
