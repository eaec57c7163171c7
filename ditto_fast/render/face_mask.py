"""The region a frame's motion changes, in crop coordinates: the face (brows to chin, temple to temple, with the
forehead and room for the open mouth) where the crop rule puts it, united with the same face moved as the
driving keypoints move it, feathered, on a coarse grid the putback samples bilinearly.

The crop rule (face/crop.py: scale 2.3, vy -0.125) puts the face box of every avatar frame at one place in the
512 crop: side 512 / 2.3 = 223 px, centre 64 px below the crop's. The driven face is that region mapped by the
affine transform that best takes the frame's source keypoints to its driven ones (least squares over the 21
points, in crop pixels), smoothed over frames and reset at a plate jump. Outside the union the plate is kept.
"""

from __future__ import annotations

import numpy as np

from ditto_fast.face.crop import SCALE, VY

GRID = 64                   # mask cells across the crop (8 px each at 512)
# the face ellipse around the face box (in units of the box side): its top takes in the forehead to the
# hairline, its bottom the chin's drop when the mouth opens wide
FOREHEAD = 0.30
JAW = 0.15
# margin and feather (crop pixels at 512), the margin chosen by measurement (scripts/support/seam_faults.coverage, tested
# in tests/test_render_seam.py): every point of a head-shaped face turned to +-30 degrees of yaw and pitch, +-20 of
# roll, with the mouth wide open and the LMDM's sway, lies where the mask is at least 0.5 (16 px: 99.5 % at 30
# degrees of yaw; 0: 94.5 %). Past that the face turns out of it: 97 % of it inside at 90 degrees of yaw
MARGIN = 24.0
FEATHER = 24.0
SMOOTH = 0.5                # weight of the new frame's transform in the running mean (1: no smoothing)


def face_ellipse(dsize: int = 512) -> tuple[float, float, float, float, float]:
    """(cx, cy, half-width, half-height above, half-height below) of the face region in crop pixels."""
    side = dsize / SCALE
    cy_box = dsize / 2 - VY * dsize            # the box centre: the crop centre moved by -vy * crop side
    top, bottom = cy_box - side / 2 - FOREHEAD * side, cy_box + side / 2 + JAW * side
    cy = (top + bottom) / 2
    return dsize / 2, cy, side / 2, cy - top, bottom - cy


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a x b of two 3-vectors (np.cross spends ~50 us a call in Python; seven a frame showed in the profile)."""
    return np.array([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


def _inv3(m: np.ndarray) -> np.ndarray:
    """Inverse of a 3x3 matrix by cofactors (numpy's LAPACK wakes an OpenBLAS thread that then spins beside every
    frame's render; see putback.py)."""
    c = np.array([_cross(m[1], m[2]), _cross(m[2], m[0]), _cross(m[0], m[1])])      # rows: cofactors
    return c.T / float(m[0] @ c[0])


def keypoint_affine(x_s: np.ndarray, x_d: np.ndarray, dsize: int = 512) -> np.ndarray:
    """2x3 affine (crop pixels) taking the source keypoints [21, 3] to the driven ones (x, y in -1..1 over the crop),
    least squares; a fit that would squash or stretch past 0.5..2 becomes the nearest rotation and scale (bounded),
    a shift is held under half a crop; identity for degenerate points."""
    half = dsize / 2
    p = (np.asarray(x_s, np.float64)[:, :2] + 1.0) * half        # [K, 2]
    q = (np.asarray(x_d, np.float64)[:, :2] + 1.0) * half
    identity = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    if not (np.isfinite(p).all() and np.isfinite(q).all()) or np.ptp(p, 0).min() < 1e-3 * dsize:
        return identity
    a = np.hstack([p, np.ones((len(p), 1))])                      # [K, 3]
    ata = a.T @ a
    if abs(float(ata[0] @ _cross(ata[1], ata[2]))) < 1e-9:
        return identity
    m = (_inv3(ata) @ (a.T @ q)).T                                # [2, 3]
    lin = m[:, :2]
    big = float((lin * lin).sum())
    det = float(lin[0, 0] * lin[1, 1] - lin[0, 1] * lin[1, 0])
    root = np.sqrt(max(big * big - 4 * det * det, 0.0))
    s_max, s_min = np.sqrt((big + root) / 2), np.sqrt(max(big - root, 0.0) / 2)
    if s_min < 0.5 or s_max > 2.0 or det <= 0:
        c, r = (lin[0, 0] + lin[1, 1]) / 2, (lin[1, 0] - lin[0, 1]) / 2        # the nearest similarity
        scale = np.hypot(c, r)
        if scale < 1e-6:
            return identity
        k = np.clip(scale, 0.5, 2.0) / scale
        m[:, :2] = [[c * k, -r * k], [r * k, c * k]]
    centre = np.array([half, half])
    shift = m[:, :2] @ centre + m[:, 2] - centre
    limit, dist = 0.5 * dsize, float(np.hypot(*shift))
    if dist > limit:
        m[:, 2] -= shift * (1 - limit / dist)
    return m


def _ellipse_mask(gx: np.ndarray, gy: np.ndarray, ellipse: tuple, margin: float, feather: float) -> np.ndarray:
    """1 inside the ellipse grown by `margin`, falling linearly to 0 over `feather` pixels outside it (distances
    measured along the ray from the centre, as a fraction of its radius)."""
    cx, cy, ax, a_up, a_down = ellipse
    ay = np.where(gy < cy, a_up, a_down)
    dx, dy = (gx - cx) / (ax + margin), (gy - cy) / (ay + margin)
    r = np.sqrt(dx * dx + dy * dy)
    reach = 1.0 + feather / (0.5 * (ax + ay) + margin)
    return np.clip((reach - r) / (reach - 1.0), 0.0, 1.0)


class FaceMask:
    """Per output frame, the face mask grid [GRID, GRID] float32 over the crop (cell i centred on crop pixel 4i + 1.5), from
    the frame's keypoints; `reset()` at a plate jump."""

    def __init__(self, dsize: int = 512, square: np.ndarray | None = None, margin: float = MARGIN,
                 feather: float = FEATHER):
        self.dsize, self.margin, self.feather = dsize, margin, feather
        cell = dsize / GRID
        centres = (np.arange(GRID) + 0.5) * cell - 0.5      # cell i averages crop pixels cell*i .. cell*(i+1)-1
        self._gx, self._gy = np.meshgrid(centres, centres)
        self.ellipse = face_ellipse(dsize)
        self._source = _ellipse_mask(self._gx, self._gy, self.ellipse, margin, feather)
        if square is not None:          # never past the crop's own feathered square
            self._square = square.reshape(GRID, dsize // GRID, GRID, dsize // GRID).min(axis=(1, 3))
            self._source = np.minimum(self._source, self._square)
        else:
            self._square = None
        self._affine: np.ndarray | None = None

    def inner_cells(self) -> np.ndarray:
        """(x0, x1, y0, y1), mask grid cells, of a rectangle where every frame's mask is 1 (sampled anywhere inside,
        bilinearly): inside the undriven face's whole part, which every mask contains."""
        whole = self._source >= 1.0                          # [G, G] cells of value 1
        cell = self.dsize / GRID
        cx, cy = int(self.ellipse[0] / cell), int(self.ellipse[1] / cell)
        x0 = x1 = cx
        y0 = y1 = cy
        grown = True
        while grown:                                          # grow a rectangle of whole cells from the centre
            grown = False
            for dx0, dx1, dy0, dy1 in ((-1, 0, 0, 0), (0, 1, 0, 0), (0, 0, -1, 0), (0, 0, 0, 1)):
                a, b, c, d = x0 + dx0, x1 + dx1, y0 + dy0, y1 + dy1
                if 0 <= a and b < GRID and 0 <= c and d < GRID and whole[c:d + 1, a:b + 1].all():
                    x0, x1, y0, y1, grown = a, b, c, d, True
        return np.array([x0, x1, y0, y1], np.float64)

    def reset(self) -> None:
        """Forget the running mean of the head's move (a cut, or the plate's mirror loop turning)."""
        self._affine = None

    def __call__(self, x_s: np.ndarray, x_d: np.ndarray) -> np.ndarray:
        """The mask grid for a frame with source keypoints x_s and driven keypoints x_d ([21, 3] each)."""
        m = keypoint_affine(x_s, x_d, self.dsize)
        self._affine = m if self._affine is None else self._affine + SMOOTH * (m - self._affine)
        inv = _inv3(np.vstack([self._affine, [0.0, 0.0, 1.0]]))
        sx = inv[0, 0] * self._gx + inv[0, 1] * self._gy + inv[0, 2]
        sy = inv[1, 0] * self._gx + inv[1, 1] * self._gy + inv[1, 2]
        moved = _ellipse_mask(sx, sy, self.ellipse, self.margin, self.feather)
        if self._square is not None:
            moved = np.minimum(moved, self._square)
        return np.maximum(self._source, moved).astype(np.float32)
