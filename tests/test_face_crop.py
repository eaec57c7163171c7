"""Crop geometry: Ditto/LivePortrait framing of the astronaut, matrices, smoothing, steadiness on video."""

from __future__ import annotations

import numpy as np
import pytest

from ditto_fast.face import crop as C
from ditto_fast.face.landmarks import FaceTracker
from synthetic import Motion, astronaut, astronaut_canvas

pytestmark = pytest.mark.register      # mediapipe: registration and its landmarks


@pytest.fixture(scope="module")
def tracker():
    with FaceTracker() as t:
        yield t


@pytest.fixture(scope="module")
def astronaut_lmk(tracker) -> np.ndarray:
    """Landmarks [478, 3] of the 512x512 astronaut picture."""
    tracker.reset()
    return tracker(astronaut(), 0)


def crop_matrix(lmk: np.ndarray) -> np.ndarray:
    """M_c2o [3, 3] float64 for one frame's landmarks [478, 2|3] in frame pixels (no smoothing)."""
    return C.params_to_matrix(C.crop_params(lmk))


def _similarity(angle_deg: float, scale: float, t: tuple[float, float]) -> np.ndarray:
    a = np.deg2rad(angle_deg)
    c, s = np.cos(a) * scale, np.sin(a) * scale
    return np.array([[c, -s, t[0]], [s, c, t[1]], [0.0, 0.0, 1.0]])


def _framing(lmk: np.ndarray, box_points: np.ndarray | None = None) -> dict[str, float]:
    """Where the eye line, mouth, brows and chin land in the 512 crop, as fractions of its height."""
    M_o2c = C.invert(C.params_to_matrix(C.crop_params(lmk, box_points=box_points)))
    eye, mouth = C.eye_and_mouth_centres(lmk)
    y = C.transform_points(np.stack([eye, mouth]), M_o2c)[:, 1] / 512
    pts = C.transform_points(lmk[:, :2], M_o2c) / 512
    return {"eye": y[0], "mouth": y[1], "brow_top": pts[list(C.BROWS), 1].min(), "chin": pts[152, 1]}


# -- framing -------------------------------------------------------------------------------------
def test_astronaut_framing(astronaut_lmk):
    """The face sits where Ditto's 203-point crop puts it; a box over all 478 points would not."""
    ours = _framing(astronaut_lmk)
    all478 = _framing(astronaut_lmk, np.arange(478))
    assert 0.44 < ours["eye"] < 0.52, ours
    assert 0.62 < ours["mouth"] < 0.70, ours
    assert 0.36 < ours["brow_top"] and ours["chin"] < 0.88, ours
    # the forehead-to-hairline points make the box taller: the face lands lower and smaller
    assert all478["eye"] > ours["eye"] + 0.03
    assert (all478["chin"] - all478["brow_top"]) < 0.9 * (ours["chin"] - ours["brow_top"])


def test_upright_face_has_zero_roll_and_vy_moves_the_box_up(astronaut_lmk):
    cx, cy, size, angle = C.crop_params(astronaut_lmk)
    assert abs(np.rad2deg(angle)) < 3.0
    cx0, cy0, size0, _ = C.crop_params(astronaut_lmk, vy=0.0)
    assert size == pytest.approx(size0)
    assert cy == pytest.approx(cy0 - 0.125 * size, abs=0.02 * size)
    assert size == pytest.approx(2.3 * C.face_size(astronaut_lmk))


@pytest.mark.parametrize("angle_deg,scale,t", [(20.0, 1.3, (400.0, -120.0)), (-35.0, 0.7, (-50.0, 300.0))])
def test_crop_follows_a_similarity(astronaut_lmk, angle_deg, scale, t):
    A = _similarity(angle_deg, scale, t)
    moved = C.transform_points(astronaut_lmk, A)
    p0, p1 = C.crop_params(astronaut_lmk), C.crop_params(moved)
    np.testing.assert_allclose(p1[:2], (A @ np.r_[p0[:2], 1.0])[:2], atol=1e-6)
    assert p1[2] == pytest.approx(p0[2] * scale)
    assert np.rad2deg(p1[3] - p0[3]) == pytest.approx(angle_deg)
    # the crops agree: the same landmarks land on the same crop pixels
    in0 = C.transform_points(astronaut_lmk, C.invert(crop_matrix(astronaut_lmk)))
    in1 = C.transform_points(moved, C.invert(crop_matrix(moved)))
    np.testing.assert_allclose(in0, in1, atol=1e-6)


# -- matrices, warps, points -----------------------------------------------------------------------
def test_params_to_matrix_geometry():
    cx, cy, size, angle = 700.0, 400.0, 256.0, np.deg2rad(30.0)
    M = C.params_to_matrix(np.array([cx, cy, size, angle]), dsize=512)
    centre = C.transform_points(np.array([[256.0, 256.0]]), M)[0]
    np.testing.assert_allclose(centre, [cx, cy])
    right = C.transform_points(np.array([[512.0, 256.0]]), M)[0] - centre     # crop +x edge
    np.testing.assert_allclose(right, 128.0 * np.array([np.cos(angle), np.sin(angle)]), atol=1e-9)
    np.testing.assert_allclose(C.invert(M) @ M, np.eye(3), atol=1e-12)
    batch = C.params_to_matrix(np.array([[cx, cy, size, angle], [1.0, 2.0, 300.0, 0.0]]))
    assert batch.shape == (2, 3, 3)
    np.testing.assert_allclose(batch[0], M)


def test_warp_crop_samples_where_the_matrix_says():
    rng = np.random.default_rng(0)
    frame = np.zeros((600, 900, 3), np.uint8)
    frame[200:203, 500:503] = 255                              # a bright dot centred at (501, 201)
    frame[..., 1] = rng.integers(0, 50, frame.shape[:2])
    M = C.params_to_matrix(np.array([480.0, 260.0, 300.0, np.deg2rad(15.0)]), dsize=256)
    crop = C.warp_crop(frame, M, dsize=256)
    assert crop.shape == (256, 256, 3) and crop.dtype == np.uint8
    want = C.transform_points(np.array([[501.0, 201.0]]), C.invert(M))[0]
    ys, xs = np.nonzero(crop[..., 0] > 60)
    w = crop[ys, xs, 0].astype(np.float64)
    got = np.array([(xs * w).sum() / w.sum(), (ys * w).sum() / w.sum()])
    np.testing.assert_allclose(got, want, atol=0.3)
    # outside the frame is black
    far = C.warp_crop(frame, C.params_to_matrix(np.array([-2000.0, -2000.0, 100.0, 0.0])), dsize=64)
    assert far.max() == 0


def test_landmarks_in_crop_normalised(astronaut_lmk):
    M = crop_matrix(astronaut_lmk)
    norm = C.landmarks_in_crop(astronaut_lmk, M)
    assert norm.shape == (478, 3) and norm.dtype == np.float32
    assert norm[:, :2].min() > 0.0 and norm[:, :2].max() < 1.0
    px = C.transform_points(astronaut_lmk, C.invert(M))
    np.testing.assert_allclose(norm, px / 512, atol=1e-6)
    k = 512 / C.crop_params(astronaut_lmk)[2]                  # crop px per frame px
    np.testing.assert_allclose(norm[:, 2], astronaut_lmk[:, 2] * k / 512, rtol=1e-5, atol=1e-7)


# -- smoothing -----------------------------------------------------------------------------------
def test_smooth_params_keeps_steady_motion_and_removes_jitter():
    n = 40
    t = np.arange(n, dtype=np.float64)
    truth = np.stack([900 + 3 * t, 500 - 2 * t, 230 + 0.4 * t, np.deg2rad(-3 + 0.15 * t)], 1)
    np.testing.assert_allclose(C.smooth_params(truth, 13), truth, atol=1e-9)
    rng = np.random.default_rng(1)
    noisy = truth + rng.normal(0, 1, truth.shape) * [0.5, 0.5, 0.8, 0.003]
    err_raw = np.abs(noisy - truth).max(0)
    err_smooth = np.abs(C.smooth_params(noisy, 13) - truth).max(0)
    assert (err_smooth < 0.6 * err_raw).all(), (err_raw, err_smooth)


def test_smooth_params_across_the_angle_wrap():
    a = np.pi - 0.01 + 0.004 * np.arange(9)               # crosses +pi
    p = np.stack([np.zeros(9), np.zeros(9), np.ones(9), np.angle(np.exp(1j * a))], 1)
    out = C.smooth_params(p, 5)
    np.testing.assert_allclose(np.exp(1j * out[:, 3]), np.exp(1j * a), atol=1e-9)


# -- on video --------------------------------------------------------------------------------------
def test_crop_follows_known_motion(tracker, astronaut_lmk):
    """Translation 3,-2 px/frame, roll -3..+2.7 degrees, 8% zoom over 20 frames of 1920x1080."""
    motion = Motion(center=(900, 500), angle_deg=-3.0, velocity=(3.0, -2.0), spin_deg=0.3, zoom=0.004)
    ref = C.crop_params(astronaut_lmk)                                    # in picture pixels
    tracker.reset()
    raw = np.stack([C.crop_params(tracker(astronaut_canvas(i, motion), i)) for i in range(20)])
    for params in (raw, C.smooth_params(raw, 13)):
        for i, p in enumerate(params):
            A = motion.matrix(i)
            _, _, s, a = motion.pose(i)
            assert np.hypot(*(p[:2] - (A @ np.r_[ref[:2], 1.0])[:2])) < 2.0, f"frame {i}: centre"
            assert p[2] == pytest.approx(ref[2] * s, rel=0.02), f"frame {i}: size"
            assert np.rad2deg(p[3] - ref[3] - a) == pytest.approx(0.0, abs=1.0), f"frame {i}: angle"


def test_static_camera_gives_a_steady_crop(tracker):
    """Sensor noise jitters the landmarks; the smoothed crop stays within half a pixel."""
    tracker.reset()
    motion = Motion(center=(960, 480))
    raw = np.stack([C.crop_params(tracker(astronaut_canvas(i, motion, noise=3.0), i)) for i in range(20)])
    smooth = C.smooth_params(raw, 13)
    dev_raw = np.hypot(*(raw[:, :2] - raw[:, :2].mean(0)).T).max()
    dev = np.hypot(*(smooth[:, :2] - smooth[:, :2].mean(0)).T).max()
    assert dev_raw > 0.05, "the noise should move the raw landmarks at all"
    assert dev < 0.5, f"smoothed crop centre moves {dev:.2f} px on a static shot"
    assert np.ptp(smooth[:, 2]) < 1.0 and np.rad2deg(np.ptp(smooth[:, 3])) < 0.3
    M = C.params_to_matrix(smooth)                                           # [20, 3, 3]
    corners = np.array([[0.0, 0.0, 1.0], [512.0, 512.0, 1.0]]).T
    spread = np.ptp(M @ corners, axis=0)[:2]                                 # crop corners in the frame
    assert spread.max() < 1.0
