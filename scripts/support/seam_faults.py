"""Decoder outputs whose faults are known, and the seam figures of a putback on them.

A perfect decoder would return the avatar's own source crop; real ones return it altered. `scene()` gives a
plate frame (the astronaut on the set, as yuv planes) and the crop matrix the crop rule gives her face; `FAULTS`
alter the plate's own crop as decoders fail; `measure()` pastes a faulty crop with a blend mode and returns:
  ring      mean |output - plate| on a ring 8 px wide just outside the face mask (levels, the worst of Y, U, V)
  step      colour step across the pasted region's own edge (mean over 32 sectors of |inside - outside| in 10 px
            bands), minus the plate's own step there (levels, worst plane; <= 0: no more than the plate's)
  untouched share of the crop square's pixels outside the face mask (their whole 2x2 block: a chroma sample's) that equal the plate exactly
  detail    mean |gradient of output - gradient of the faulty crop| inside the face mask (levels)
`flicker()` gives the frame-to-frame change of the seamless correction on a static plate.
"""

from __future__ import annotations

import cv2
import numpy as np

from ditto_fast.face.crop import SCALE, VY
from ditto_fast.media.yuv import I420, Layout, rgb_to_i420
from ditto_fast.render.putback import YuvPutback
from synthetic import Motion, astronaut_canvas

FACE_IN_PICTURE = (222.0, 128.0)     # the astronaut's face box centre in her 512 picture (brows to chin)


def scene(size: tuple[int, int] = (960, 540), face_px: float = 110.0, noise: float = 0.0,
          seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(plate RGB [H, W, 3], plate yuv420p, M_c2o 3x3) for the astronaut with a face of `face_px`."""
    w, h = size
    motion = Motion.for_face(face_px, center=(w * 0.5, h * 0.52))
    rgb = astronaut_canvas(0, motion, size, noise=noise, seed=seed)
    m = motion.matrix(0)
    centre = m[:2, :2] @ np.array(FACE_IN_PICTURE) + m[:2, 2]
    side = SCALE * face_px
    centre = centre + np.array([0.0, VY * side])          # the crop's centre, towards the forehead
    s = side / 512
    M_c2o = np.array([[s, 0.0, centre[0] - side / 2], [0.0, s, centre[1] - side / 2], [0.0, 0.0, 1.0]])
    return rgb, rgb_to_i420(rgb), M_c2o


def own_crop(rgb: np.ndarray, M_c2o: np.ndarray) -> np.ndarray:
    """The plate's own 512 crop (what a perfect decoder returns)."""
    return cv2.warpAffine(rgb, np.linalg.inv(M_c2o)[:2], (512, 512), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_REPLICATE)


def _face_region(dsize: int = 512) -> np.ndarray:
    """The seamless mode's face mask at crop resolution for the undriven face."""
    grid = YuvPutback(blend="seamless").face_mask(np.zeros((1, 3)), np.zeros((1, 3)))
    return cv2.resize(grid, (dsize, dsize), interpolation=cv2.INTER_LINEAR)


def _clip(a: np.ndarray) -> np.ndarray:
    return np.clip(a, 0, 255).astype(np.uint8)


def colour_cast(c: np.ndarray) -> np.ndarray:
    return _clip(c * np.array([1.06, 1.0, 0.95]))


def brightness(c: np.ndarray) -> np.ndarray:
    return _clip(c.astype(np.float32) + 8)


def lighting_ramp(c: np.ndarray) -> np.ndarray:
    ramp = np.linspace(-12, 12, c.shape[1], dtype=np.float32)[None, :, None]
    return _clip(c.astype(np.float32) + ramp)


def new_background(c: np.ndarray) -> np.ndarray:
    """The crop's area outside the face replaced by a blurred, darker re-synthesis."""
    inside = (_face_region() > 0.999)[..., None]
    resynth = cv2.GaussianBlur(c, (0, 0), 6).astype(np.float32) * 0.9
    return np.where(inside, c, _clip(resynth))


def shifted(c: np.ndarray) -> np.ndarray:
    return cv2.warpAffine(c, np.array([[1.0, 0.0, 1.5], [0.0, 1.0, -1.0]]), (512, 512), borderMode=cv2.BORDER_REPLICATE)


FAULTS = {"colour cast": colour_cast, "brightness +8": brightness, "lighting ramp": lighting_ramp,
          "new background": new_background, "1.5 px shift": shifted}


def pasted_mask(blend: str, M_c2o: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The blend's mask in frame pixels [H, W] float32 (the square feather, or the face mask)."""
    mask = YuvPutback().mask if blend == "feather" else _face_region()
    return cv2.warpAffine(mask, M_c2o[:2], size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)


def _sector_step(planes: np.ndarray, inner: np.ndarray, outer: np.ndarray, centre: np.ndarray) -> float:
    """Largest over the planes [H, W, 3] of the mean over 32 angular sectors of |mean inside band - mean outside
    band| (sectors holding both bands)."""
    h, w = inner.shape
    yy, xx = np.mgrid[0:h, 0:w]
    sector = ((np.arctan2(yy - centre[1], xx - centre[0]) + np.pi) / (2 * np.pi) * 32).astype(int) % 32
    worst = 0.0
    for c in range(planes.shape[2]):
        steps = []
        for k in range(32):
            a, b = inner & (sector == k), outer & (sector == k)
            if a.sum() > 20 and b.sum() > 20:
                steps.append(abs(planes[a, c].mean() - planes[b, c].mean()))
        worst = max(worst, float(np.mean(steps)))
    return worst


def _full_planes(frame: np.ndarray, layout: Layout = I420) -> np.ndarray:
    """A planar frame as [H, W, 3] float64 (Y, U, V; chroma repeated over the pixels each sample covers)."""
    luma, chroma = layout.planes(frame)
    h, w = luma.shape[1:]
    uv = [cv2.resize(c, (w, h), interpolation=cv2.INTER_NEAREST) for c in chroma]
    return np.dstack([luma[0], *uv]).astype(np.float64)


def _band(region: np.ndarray, px: int) -> np.ndarray:
    """The pixels outside `region` (bool) within `px` of it."""
    k = np.ones((2 * px + 1, 2 * px + 1), np.uint8)
    return (cv2.dilate(region.astype(np.uint8), k) > 0) & ~region


def measure(blend: str, fault, size: tuple[int, int] = (960, 540), plate_rgb: np.ndarray | None = None,
            crop: np.ndarray | None = None) -> dict:
    """The seam figures of pasting the faulty own crop with `blend` (see the module docstring); a plate and crop
    of the caller's may replace the scene's."""
    rgb, plate, M = scene(size)
    if plate_rgb is not None:
        rgb, plate = plate_rgb, rgb_to_i420(plate_rgb)
    crop = fault(own_crop(rgb, M)) if crop is None else crop
    out = YuvPutback(blend=blend)(plate.copy(), crop, M)
    got, want = _full_planes(out), _full_planes(plate)
    face = pasted_mask("seamless", M, size)
    ring = _band(face > 0, 8)                                    # just outside the face mask
    m = pasted_mask(blend, M, size)                              # this blend's own pasted region
    whole, some = m >= 0.999, m > 0
    inner, outer = _band(~whole, 10) & whole, _band(some, 10)
    centre = M[:2, :2] @ np.array([256.0, 320.0]) + M[:2, 2]
    step = _sector_step(got, inner, outer, centre) - _sector_step(want, inner, outer, centre)
    square = cv2.warpAffine(np.ones((512, 512), np.float32), M[:2], size) > 0.999
    # outside the face: pixels whose whole 2x2 block (a 4:2:0 chroma sample's) lies outside the face mask
    h2, w2 = size[1] // 2, size[0] // 2
    blocks = (face[:2 * h2, :2 * w2] <= 0).reshape(h2, 2, w2, 2).all(axis=(1, 3))
    outside_face = square & np.kron(blocks, np.ones((2, 2), bool))
    untouched = float((got[outside_face] == want[outside_face]).all(axis=1).mean())
    warped = cv2.warpAffine(cv2.transform(crop.astype(np.float32), _luma_row()), M[:2], size, flags=cv2.INTER_LINEAR)
    core = cv2.erode((face >= 0.999).astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    luma = got[..., 0]
    detail = float(np.mean([np.abs(np.diff(luma, axis=0) - np.diff(warped, axis=0))[core[:-1]].mean(),
                            np.abs(np.diff(luma, axis=1) - np.diff(warped, axis=1))[core[:, :-1]].mean()]))
    return {"ring": float(np.abs(got - want)[ring].mean(axis=0).max()), "step": step, "untouched": untouched,
            "detail": detail}


def _luma_row() -> np.ndarray:
    from ditto_fast.media.yuv import rgb_to_yuv_matrix

    return rgb_to_yuv_matrix("bt709")[:1]


def flicker(fault, frames: int = 12, noise: float = 2.0, size: tuple[int, int] = (960, 540)) -> float:
    """Mean frame-to-frame change (levels) of the seamless correction on a static plate, the decoder's output
    jittering by `noise` (std, levels) from frame to frame."""
    rgb, plate, M = scene(size)
    base = fault(own_crop(rgb, M)).astype(np.float32)
    putback = YuvPutback(blend="seamless")
    rng = np.random.default_rng(0)
    last, changes = None, []
    for _ in range(frames):
        crop = _clip(base + rng.normal(0, noise, base.shape))
        putback(plate.copy(), crop, M)
        corr = putback.seam._last.copy()
        if last is not None:
            changes.append(float(np.abs(corr - last).mean()))
        last = corr
    return float(np.mean(changes[2:]))


def _rotation(yaw: float, pitch: float, roll: float) -> np.ndarray:
    """3x3 rotation (degrees): yaw about the vertical axis, pitch about the horizontal, roll in the picture."""
    y, p, r = np.deg2rad([yaw, pitch, roll])
    ry = np.array([[np.cos(y), 0, np.sin(y)], [0, 1, 0], [-np.sin(y), 0, np.cos(y)]])
    rx = np.array([[1, 0, 0], [0, np.cos(p), -np.sin(p)], [0, np.sin(p), np.cos(p)]])
    rz = np.array([[np.cos(r), -np.sin(r), 0], [np.sin(r), np.cos(r), 0], [0, 0, 1]])
    return rz @ ry @ rx


def head_points(n: int = 400, seed: int = 0) -> np.ndarray:
    """Points of the face (brows to chin, temple to temple, the forehead to the hairline) on a head-shaped
    ellipsoid, crop pixels about the head's centre [n, 3] (x right, y down, z towards the camera negative)."""
    from ditto_fast.render.face_mask import FOREHEAD, face_ellipse

    cx, cy, ax, a_up, a_down = face_ellipse()
    side = 512 / SCALE
    rng = np.random.default_rng(seed)
    pts = []
    while len(pts) < n:
        x, y = rng.uniform(-1, 1, 2)
        if x * x + y * y > 1:
            continue
        # the face box (brows to chin) plus the forehead, the outline's own half sizes
        hx = side / 2
        hy_up, hy_down = side / 2 + FOREHEAD * side, side / 2
        px, py = x * hx, (y * (hy_up if y < 0 else hy_down))
        depth = 0.9 * hx * np.sqrt(max(0.0, 1 - x * x - y * y))
        pts.append((px, py, -depth))
    return np.array(pts)


def posed(points: np.ndarray, yaw: float = 0, pitch: float = 0, roll: float = 0, scale: float = 1.0,
          shift: tuple[float, float] = (0.0, 0.0), jaw: float = 0.0) -> np.ndarray:
    """The points [n, 3] of a head at that pose, projected to crop pixels [n, 2]; `jaw` (crop pixels) lowers the
    points below the mouth as an open mouth does."""
    side = 512 / SCALE
    centre = np.array([256.0, 256.0 - VY * 512])                  # the face box centre in the crop
    p = points.copy()
    below = p[:, 1] > 0.25 * side                                 # under the mouth line
    p[below, 1] += jaw * (p[below, 1] - 0.25 * side) / (0.25 * side)
    q = (p + np.array([0.0, 0.0, 0.6 * side])) @ _rotation(yaw, pitch, roll).T - np.array([0.0, 0.0, 0.6 * side])
    return q[:, :2] * scale + centre + np.array(shift)


def to_keypoints(xy: np.ndarray) -> np.ndarray:
    """Crop pixels [n, 2] as keypoints [n, 3] (x, y in -1..1 over the crop)."""
    return np.hstack([xy / 256.0 - 1.0, np.zeros((len(xy), 1))])


def coverage(yaw: float = 0, pitch: float = 0, roll: float = 0, scale: float = 1.0,
             shift: tuple[float, float] = (0.0, 0.0), jaw: float = 0.0, margin: float | None = None) -> float:
    """Share of the posed face's points inside the face mask (value >= 0.5) that FaceMask builds from 21 of them
    as keypoints: 1.0 when the generated face stays inside."""
    from ditto_fast.render import face_mask as fm

    pts = head_points()
    kps = np.random.default_rng(1).choice(len(pts), 21, replace=False)
    src, drv = posed(pts), posed(pts, yaw, pitch, roll, scale, shift, jaw)
    mask = fm.FaceMask(margin=fm.MARGIN if margin is None else margin)(to_keypoints(src[kps]), to_keypoints(drv[kps]))
    up = cv2.resize(mask, (512, 512), interpolation=cv2.INTER_LINEAR)
    ix, iy = np.clip(np.rint(drv).astype(int), 0, 511).T
    return float((up[iy, ix] >= 0.5).mean())
