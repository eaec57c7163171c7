"""`avatars show NAME --preview OUT.png`: one picture of an avatar, to check it before it airs.

Top: a contact sheet of evenly spaced source frames (from the plate) with the crop box and the kept
landmarks drawn on them, each beside its 512x512 crop. Below: time plots over the frames of the head
pose (pitch, yaw, roll from x_s_info), the eye openness and the mouth openness (with the threshold
registration warns at), the shown frames marked on each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ditto_fast.avatar import Avatar
from ditto_fast.avatar.mouth_check import mouth_check_of
from ditto_fast.avatar.plate import PlateReader
from ditto_fast.face.crop import DSIZE, warp_crop
from ditto_fast.face.kept_points import group_of
from ditto_fast.motion.keypoints import bins_to_degrees
from ditto_fast.preview.canvas import (BLUE, GREEN, GREY, INK, MARGIN, ORANGE, RED, WIDTH, Box, TimePlot, evenly_spaced,
                     frame_ticks, page, paste, text, write_png)

FRAMES_SHOWN = 6
PAIRS_PER_ROW = 2
HEADER = 56
LABEL = 22                       # a frame's caption above its pair
PLOT_H, AXIS_H = 150, 38
CROP_BOX_COLOUR = (255, 0, 255)  # BGR magenta, drawn without anti-aliasing so its pixels are exactly this
POINT_COLOURS = {"contour": (0, 215, 255), "brows": (0, 215, 255), "nose": (0, 215, 255),
                 "eyes": (255, 255, 0), "mouth": (60, 60, 255), "other": (255, 255, 255)}


@dataclass(frozen=True)
class SheetLayout:
    """Where everything goes on the page."""

    frames: np.ndarray        # [F] the frames shown
    sources: list[Box]        # the source frame of each, crop box drawn on it
    crops: list[Box]          # its 512 crop
    plots: list[Box]          # pose, eyes, mouth
    height: int


def sheet_layout(n_frames: int, size: tuple[int, int], shown: int = FRAMES_SHOWN) -> SheetLayout:
    """The layout for an avatar of n_frames frames of `size` (w, h): pairs of (source, crop), then three plots."""
    frames = evenly_spaced(n_frames, shown)
    w, h = size
    pair_w = (WIDTH - (PAIRS_PER_ROW + 1) * MARGIN) // PAIRS_PER_ROW
    cell_h = min(380, int((pair_w - 8) / (w / h + 1)))
    src_w = int(round(cell_h * w / h))
    sources, crops = [], []
    y = HEADER
    for j in range(len(frames)):
        col, row = j % PAIRS_PER_ROW, j // PAIRS_PER_ROW
        x = MARGIN + col * (pair_w + MARGIN)
        top = y + row * (LABEL + cell_h + MARGIN) + LABEL
        sources.append(Box(x, top, src_w, cell_h))
        crops.append(Box(x + src_w + 8, top, cell_h, cell_h))
    rows = -(-len(frames) // PAIRS_PER_ROW)
    y += rows * (LABEL + cell_h + MARGIN)
    plots = []
    for _ in range(3):
        plots.append(Box(MARGIN, y, WIDTH - 2 * MARGIN, PLOT_H))
        y += PLOT_H + AXIS_H
    return SheetLayout(frames, sources, crops, plots, y + MARGIN // 2)


def crop_corners(M_c2o: np.ndarray, dsize: int = DSIZE) -> np.ndarray:
    """The crop square's corners [4, 2] in frame pixels (clockwise from the crop's top left)."""
    sq = np.array([[0, 0, 1], [dsize, 0, 1], [dsize, dsize, 1], [0, dsize, 1]], np.float64)
    return (sq @ np.asarray(M_c2o, np.float64).T)[:, :2]


def _stored_points(avatar: Avatar) -> tuple[np.ndarray, list[str]] | None:
    """(crop-pixel points [N, K, 2], group per point) kept at registration, or None for older avatars."""
    lm = avatar.meta.get("extra", {}).get("landmarks")
    if not isinstance(lm, dict) or not isinstance(lm.get("crop_xy"), np.ndarray):
        return None
    xy = lm["crop_xy"]
    if xy.ndim != 3 or xy.shape[0] != avatar.n_frames:
        return None
    return xy.astype(np.float64), group_of(lm["index"])


def _dots(img: np.ndarray, pts: np.ndarray, groups: list[str], radius: int) -> None:
    for (x, y), g in zip(pts, groups):
        cv2.circle(img, (int(round(x)), int(round(y))), radius, POINT_COLOURS[g], -1, cv2.LINE_AA)


def _draw_pair(img: np.ndarray, avatar: Avatar, frame_rgb: np.ndarray, k: int, src: Box, crop: Box,
               points: tuple[np.ndarray, list[str]] | None) -> None:
    """One source frame with its crop box and points, and its crop beside it."""
    M = avatar.M_c2o[k]
    s = paste(img, frame_rgb, src)
    paste(img, warp_crop(frame_rgb, M, DSIZE), crop)
    if points is not None:
        xy, groups = points
        in_frame = np.c_[xy[k], np.ones(len(xy[k]))] @ M.T
        _dots(img, in_frame[:, :2] * s + (src.x, src.y), groups, 1)
        _dots(img, xy[k] * (crop.w / DSIZE) + (crop.x, crop.y), groups, 2)
    corners = np.round(crop_corners(M) * s).astype(np.int32)               # cell pixels
    cell = np.ascontiguousarray(img[src.y:src.y + src.h, src.x:src.x + src.w])  # the box is cut at the cell's edge
    cv2.polylines(cell, [corners.reshape(-1, 1, 2)], True, CROP_BOX_COLOUR, 2, cv2.LINE_8)
    img[src.y:src.y + src.h, src.x:src.x + src.w] = cell
    text(img, f"frame {k}  ({k / avatar.fps:.2f} s)", src.x, src.y - 6, 0.5, INK, bold=True)


def _plots(img: np.ndarray, avatar: Avatar, lay: SheetLayout) -> None:
    """Head pose, eye and mouth openness over the frames, the shown frames marked."""
    n = avatar.n_frames
    x = np.arange(n)
    ticks = frame_ticks(n)

    def panel(i: int, lo: float, hi: float, label: str) -> TimePlot:
        p = TimePlot(img, lay.plots[i], max(n - 1, 1), lo, hi, label)
        for k in lay.frames:
            p.vmark(float(k))
        p.x_axis(ticks, [str(t) for t in ticks], "frame")
        return p

    pose = {k: bins_to_degrees(avatar.x_s_info[k]) for k in ("pitch", "yaw", "roll")}
    lo = min(float(v.min()) for v in pose.values())
    hi = max(float(v.max()) for v in pose.values())
    mid, half = (lo + hi) / 2, max((hi - lo) / 2 * 1.15, 5.0)
    p = panel(0, mid - half, mid + half, "head pose (degrees)")
    for v, colour in zip(pose.values(), (BLUE, ORANGE, GREEN)):
        p.line(x, v, colour)
    p.legend([("pitch", BLUE), ("yaw", ORANGE), ("roll", GREEN)])

    eye = np.asarray(avatar.eye_open, np.float64)
    p = panel(1, 0.0, max(float(eye.max()) * 1.15, 0.1), "eye openness (lids / width)")
    p.line(x, eye[:, 0], BLUE)
    p.line(x, eye[:, 1], ORANGE)
    p.legend([("eye on the image's left", BLUE), ("on its right", ORANGE)])

    label = "mouth openness (inner-lip gap / mouth width)"
    check = mouth_check_of(avatar.meta)
    if check is None:
        p = panel(2, 0.0, 0.5, label)
        text(img, "not measured: this avatar was registered before mouth checks; register it again to see it",
             p.left + 12, (p.top + p.bottom) // 2, 0.5, GREY)
        return
    mouth = check.openness.astype(np.float64)
    p = panel(2, 0.0, max(float(mouth.max()), check.threshold) * 1.3, label)
    p.spans(mouth > check.threshold, RED)
    p.hline(check.threshold, RED, f"open above {check.threshold:g}")
    p.line(x, mouth, INK)
    if check.flagged:
        p.legend([(f"WARNING: open on {len(check.open_frames)} of {n} frames", RED)])


def avatar_sheet(avatar: Avatar) -> np.ndarray:
    """The preview page of a loaded avatar: BGR uint8 [H, 1600, 3]."""
    lay = sheet_layout(avatar.n_frames, avatar.size)
    img = page(lay.height)
    points = _stored_points(avatar)
    w, h = avatar.size
    src = Path(str(avatar.meta.get("source", {}).get("path", ""))).name
    text(img, f"avatar {avatar.name}: {avatar.n_frames} frames at {avatar.rate} fps, {w}x{h}, from {src}",
         MARGIN, 24, 0.65, INK, bold=True)
    key = ("magenta: crop box;  dots: landmarks kept at registration (yellow face outline, cyan eyes, red mouth)"
           if points is not None else
           "magenta: crop box;  landmarks not stored (registered before previews): register again to see them")
    text(img, key, MARGIN, 46, 0.5)
    with PlateReader(avatar.plate_source, avatar.n_frames, block_frames=1, is_image=avatar.is_image) as plate:
        for k, sb, cb in zip(lay.frames, lay.sources, lay.crops):
            _draw_pair(img, avatar, plate.frame(int(k)), int(k), sb, cb, points)
    _plots(img, avatar, lay)
    return img


def write_avatar_preview(avatar: Avatar, path: str | os.PathLike) -> Path:
    """Draw the avatar's preview and write it as a PNG at `path` (atomically); returns the path."""
    return write_png(avatar_sheet(avatar), path)
