"""The Ditto/LivePortrait face crop from mediapipe landmarks: parameters, smoothing, matrices, warps.

A crop is four numbers (cx, cy, size, angle): the centre and side of a square in frame pixels and
the face's roll in radians (positive = the face's x-axis turned clockwise on screen, y pointing
down). The crop maps that square, de-rotated, onto a dsize x dsize image. ``M_c2o`` (3x3) takes crop
pixels to frame pixels and ``M_o2c`` is its inverse.

The geometry follows LivePortrait's ``parse_rect_from_landmark`` as Ditto uses it (scale 2.3,
vx 0, vy -0.125): the up-axis runs from the eye centre to the mouth centre; the landmarks' bounding
box is taken in that rotated frame, made square and scaled; the centre is then shifted by
vy * size along the up-axis (negative = towards the forehead). The box is built from the mediapipe
points that cover what Ditto's 203-point set covers (jaw and cheek contour below the brows, brows,
eyes, nose, lips) and not the forehead points up to the hairline, which would make the box taller
and push the face down and smaller in the crop.
"""

from __future__ import annotations

import cv2
import numpy as np

from ditto_fast.media.yuv import YuvFrame, frame_region

# Eye centre per eye: the two corners and the middle of each lid; mouth centre: the two corners.
EYE_POINTS = ((33, 133, 159, 145), (362, 263, 386, 374))
MOUTH_CORNERS = (61, 291)

# Face contour from one temple round the chin to the other, without the forehead (mediapipe's face
# oval minus its points above the brows).
CONTOUR = (162, 127, 234, 93, 132, 58, 172, 136, 150, 149, 176, 148, 152,
           377, 400, 378, 379, 365, 397, 288, 361, 323, 454, 356, 389)
BROWS = (70, 63, 105, 66, 107, 55, 65, 52, 53, 46,
         300, 293, 334, 296, 336, 285, 295, 282, 283, 276)
EYES = (33, 7, 163, 144, 145, 153, 154, 155, 133, 173, 157, 158, 159, 160, 161, 246,
        263, 249, 390, 373, 374, 380, 381, 382, 362, 398, 384, 385, 386, 387, 388, 466)
NOSE = (168, 6, 197, 195, 5, 4, 1, 19, 94, 2, 98, 327, 64, 294, 48, 278, 115, 344, 220, 440, 45, 275)
LIPS = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185,
        78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308, 415, 310, 311, 312, 13, 82, 81, 80, 191)
FACE_BOX_POINTS = np.array(CONTOUR + BROWS + EYES + NOSE + LIPS, dtype=np.int64)

DSIZE = 512
SCALE = 2.3
VX = 0.0
VY = -0.125


def eye_and_mouth_centres(lmk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eye centre [2], mouth centre [2]) in the landmarks' coordinates: the crop's up-axis ends."""
    pts = np.asarray(lmk, dtype=np.float64)[:, :2]  # [478, 2]
    eye_a = pts[list(EYE_POINTS[0])].mean(0)
    eye_b = pts[list(EYE_POINTS[1])].mean(0)
    mouth = pts[list(MOUTH_CORNERS)].mean(0)
    return (eye_a + eye_b) / 2, mouth


def _axes(lmk: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(ux, uy, angle): the face's x and down axes in the image and its roll in radians."""
    eye, mouth = eye_and_mouth_centres(lmk)
    uy = mouth - eye
    norm = float(np.hypot(*uy))
    uy = np.array([0.0, 1.0]) if norm <= 1e-3 else uy / norm
    ux = np.array([uy[1], -uy[0]])
    return ux, uy, float(np.arctan2(ux[1], ux[0]))


def _face_box(lmk: np.ndarray, ux: np.ndarray, uy: np.ndarray,
              box_points: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """(box centre [2] in image coordinates, square side) of the face points in the rotated frame."""
    idx = FACE_BOX_POINTS if box_points is None else box_points
    pts = np.asarray(lmk, dtype=np.float64)[idx, :2]              # [K, 2]
    rot = np.stack([ux, uy])                                        # rows: face x, face y
    rpts = pts @ rot.T                                              # [K, 2] in the face frame
    lo, hi = rpts.min(0), rpts.max(0)
    centre = ((lo + hi) / 2) @ rot                                  # back to image coordinates
    return centre, float((hi - lo).max())


def face_size(lmk: np.ndarray) -> float:
    """Side of the square face box (brows to chin, temple to temple), unscaled, in the landmarks' units."""
    ux, uy, _ = _axes(lmk)
    return _face_box(lmk, ux, uy)[1]


def crop_params(lmk: np.ndarray, scale: float = SCALE, vx: float = VX, vy: float = VY,
                box_points: np.ndarray | None = None) -> np.ndarray:
    """(cx, cy, size, angle) [4] of the crop for landmarks [478, 2|3] in frame pixels.

    `box_points` chooses the landmarks that bound the box (default FACE_BOX_POINTS, no forehead).
    """
    ux, uy, angle = _axes(lmk)
    centre, side = _face_box(lmk, ux, uy, box_points)
    size = side * scale
    centre = centre + ux * (vx * size) + uy * (vy * size)
    return np.array([centre[0], centre[1], size, angle], dtype=np.float64)


def smooth_params(params: np.ndarray, window: int = 13) -> np.ndarray:
    """Crop parameters smoothed over time [N, 4] -> [N, 4]: a centred moving average of `window` frames.

    Near the ends, where the window is cut short, each value is the straight-line fit over the frames
    the window still holds (in the interior that fit is exactly the centred mean), so steady motion is
    followed without lag or bias while a static face stays still up to the last frame. Angles are
    unwrapped first, so a roll crossing +-pi averages correctly.
    """
    p = np.asarray(params, dtype=np.float64).copy()  # [N, 4]
    if p.ndim != 2 or p.shape[1] != 4:
        raise ValueError(f"crop parameters must be [N, 4], got {p.shape}")
    n = p.shape[0]
    half = max(int(window), 1) // 2
    if n < 2 or half == 0:
        return p
    p[:, 3] = np.unwrap(p[:, 3])
    j = np.arange(n, dtype=np.float64)
    c0 = np.concatenate([np.zeros((1, 4)), np.cumsum(p, axis=0)])                 # sums of p
    c1 = np.concatenate([np.zeros((1, 4)), np.cumsum(p * j[:, None], axis=0)])    # sums of j * p
    i = np.arange(n)
    a, b = np.maximum(i - half, 0), np.minimum(i + half, n - 1)                     # window [a, b]
    d0, d1 = (a - i).astype(np.float64), (b - i).astype(np.float64)                # offsets from i
    s0 = d1 - d0 + 1
    s1 = (d1 * (d1 + 1) - (d0 - 1) * d0) / 2                                      # sum of offsets
    s2 = (d1 * (d1 + 1) * (2 * d1 + 1) - (d0 - 1) * d0 * (2 * d0 - 1)) / 6        # sum of squares
    t0 = c0[b + 1] - c0[a]
    t1 = c1[b + 1] - c1[a] - i[:, None] * t0                                       # sum of offset * p
    det = (s0 * s2 - s1 * s1)[:, None]
    out = (s2[:, None] * t0 - s1[:, None] * t1) / det                              # line's value at i
    out[:, 3] = np.angle(np.exp(1j * out[:, 3]))                                   # back into (-pi, pi]
    return out


def params_to_matrix(params: np.ndarray, dsize: int = DSIZE) -> np.ndarray:
    """Crop-to-original matrix M_c2o [3, 3] (or [N, 3, 3]) from crop parameters [4] (or [N, 4])."""
    p = np.asarray(params, dtype=np.float64)
    cx, cy, size, angle = (p[..., k] for k in range(4))
    k = size / dsize                      # frame pixels per crop pixel
    c, s = np.cos(angle) * k, np.sin(angle) * k
    t = dsize / 2
    m = np.zeros(p.shape[:-1] + (3, 3))
    m[..., 0, 0], m[..., 0, 1], m[..., 0, 2] = c, -s, cx - (c - s) * t
    m[..., 1, 0], m[..., 1, 1], m[..., 1, 2] = s, c, cy - (s + c) * t
    m[..., 2, 2] = 1.0
    return m


def invert(M: np.ndarray) -> np.ndarray:
    """Inverse of a 3x3 (or [N, 3, 3]) affine matrix, e.g. M_c2o -> M_o2c."""
    return np.linalg.inv(np.asarray(M, dtype=np.float64))


def warp_crop(frame: np.ndarray | YuvFrame, M_c2o: np.ndarray, dsize: int = DSIZE) -> np.ndarray:
    """The dsize x dsize crop [dsize, dsize, C] uint8 of a frame [H, W, C] or a YuvFrame; outside the frame is black.

    Only the part of the frame the crop covers is read (and, for a YuvFrame, converted to RGB); the
    result is the same as warping the whole frame.
    """
    M = np.asarray(M_c2o, dtype=np.float64)[:2].copy()
    h, w = frame.shape[:2]
    corners = np.array([[0, 0, 1], [dsize, 0, 1], [0, dsize, 1], [dsize, dsize, 1]], np.float64) @ M.T
    # bilinear taps reach one pixel past a sample; one more for rounding
    x0, y0 = (max(0, int(np.floor(v)) - 2) for v in corners.min(0))
    x1, y1 = min(w, int(np.ceil(corners[:, 0].max())) + 3), min(h, int(np.ceil(corners[:, 1].max())) + 3)
    if x1 <= x0 or y1 <= y0:
        return np.zeros((dsize, dsize, frame.shape[2]), np.uint8)
    M[:, 2] -= (x0, y0)
    return cv2.warpAffine(
        np.ascontiguousarray(frame_region(frame, x0, y0, x1, y1)), M, (dsize, dsize),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_CONSTANT, borderValue=0,
    )


def transform_points(pts: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Points [N, 2|3] through a similarity M [3, 3]; a third column (depth) is scaled with x and y."""
    pts = np.asarray(pts, dtype=np.float64)
    M = np.asarray(M, dtype=np.float64)
    out = pts.copy()
    out[:, :2] = pts[:, :2] @ M[:2, :2].T + M[:2, 2]
    if pts.shape[1] > 2:
        out[:, 2:] = pts[:, 2:] * np.sqrt(abs(np.linalg.det(M[:2, :2])))
    return out


def landmarks_in_crop(lmk_px: np.ndarray, M_c2o: np.ndarray, dsize: int = DSIZE) -> np.ndarray:
    """Frame-pixel landmarks [478, 3] -> crop landmarks [478, 3] normalised like mediapipe's (x, y, z) / dsize."""
    lmk = np.asarray(lmk_px, dtype=np.float64)
    if lmk.shape[1] == 2:
        lmk = np.concatenate([lmk, np.zeros((lmk.shape[0], 1))], axis=1)
    return (transform_points(lmk, invert(M_c2o)) / dsize).astype(np.float32)
