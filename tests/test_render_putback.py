"""Putback: feathered mask, bbox-limited Cython blend vs a full-frame float reference, numpy fallback."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from ditto_fast.render import putback as pb_mod
from ditto_fast.render.putback import Putback, crop_bbox, feathered_mask

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def blend_kernel():
    """The compiled _blend module, built in place if missing; skips when no C compiler is available."""
    try:
        mod = importlib.import_module("ditto_fast.render._blend")
    except ImportError:
        if shutil.which("cc") is None and shutil.which("gcc") is None:
            pytest.skip("no C compiler available to build ditto_fast.render._blend")
        res = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            pytest.skip(f"building ditto_fast.render._blend failed: {res.stderr.strip().splitlines()[-1:]}")
        importlib.invalidate_caches()
        mod = importlib.import_module("ditto_fast.render._blend")
    pb_mod._blend = mod
    return mod


def reference_putback(bg: np.ndarray, crop: np.ndarray, M_c2o: np.ndarray) -> np.ndarray:
    """Full-frame float32 blend: warp crop and mask over the whole frame, blend, round."""
    h, w = bg.shape[:2]
    mask = feathered_mask(crop.shape[0])
    mask_w = cv2.warpAffine(mask, M_c2o[:2], (w, h), flags=cv2.INTER_LINEAR).clip(0, 1)[..., None]
    crop_w = cv2.warpAffine(crop.astype(np.float32), M_c2o[:2], (w, h), flags=cv2.INTER_LINEAR)
    out = mask_w * crop_w + (1.0 - mask_w) * bg.astype(np.float32)
    return np.round(out).clip(0, 255).astype(np.uint8)


def smooth_crop(rng: np.random.Generator, size: int = 512, cells: int = 24) -> np.ndarray:
    """Random band-limited crop (like a rendered face, unlike white noise).

    OpenCV quantises warp source coordinates to 1/32 px and rounds them differently for a
    translated ROI than for the full frame, so white noise can differ by ~10 levels between the
    two warps; with image-like content the difference stays within one level.
    """
    small = rng.integers(0, 256, (cells, cells, 3), dtype=np.uint8)
    return cv2.resize(small, (size, size), interpolation=cv2.INTER_CUBIC)


def similarity(scale: float, angle: float, tx: float, ty: float) -> np.ndarray:
    """3x3 crop->frame matrix: rotate by angle (radians), scale, translate."""
    c, s = scale * np.cos(angle), scale * np.sin(angle)
    return np.array([[c, -s, tx], [s, c, ty], [0.0, 0.0, 1.0]])


CASES = {
    "scale_translate": ((360, 640), similarity(0.8, 0.0, 150.3, 20.7)),
    "rotated": ((360, 640), similarity(0.7, 0.35, 250.0, 10.0)),
    "rotated_neg_upscale": ((360, 640), similarity(1.1, -0.6, 100.0, 150.0)),
    "left_top_outside": ((360, 640), similarity(0.9, 0.2, -180.0, -120.0)),
    "right_bottom_outside": ((360, 640), similarity(0.9, -0.1, 480.0, 250.0)),
    "larger_than_frame": ((200, 300), similarity(1.5, 0.1, -200.0, -250.0)),
    "quarter_turn": ((360, 640), similarity(0.6, np.pi / 2, 400.0, 20.0)),
    "sheared_flipped": ((360, 640), np.array([[0.5, 0.2, 200.0], [0.1, -0.6, 340.0], [0.0, 0.0, 1.0]])),
}


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "numpy"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_full_frame_float_reference(request, name, use_kernel):
    if use_kernel:
        request.getfixturevalue("blend_kernel")
    (h, w), M = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    bg = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    crop = smooth_crop(rng)
    ref = reference_putback(bg, crop, M)
    out = Putback(use_kernel=use_kernel)(bg.copy(), crop, M)
    diff = np.abs(out.astype(np.int16) - ref.astype(np.int16))
    assert diff.max() <= 1, f"{name}: max diff {diff.max()}"
    assert (out != bg).any(), "nothing was pasted"


def test_noise_crop_exact_for_integer_translation(blend_kernel):
    rng = np.random.default_rng(3)
    bg = rng.integers(0, 256, (600, 700, 3), dtype=np.uint8)
    crop = rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)
    M = similarity(1.0, 0.0, 90.0, -40.0)
    out = Putback()(bg.copy(), crop, M)
    assert np.abs(out.astype(np.int16) - reference_putback(bg, crop, M)).max() <= 1
    # the mask's interior is 1: the crop itself shows there
    assert np.array_equal(out[100:400, 200:500], crop[140:440, 110:410])


def test_pixels_outside_bbox_untouched(blend_kernel):
    rng = np.random.default_rng(4)
    bg = rng.integers(0, 256, (360, 640, 3), dtype=np.uint8)
    crop = smooth_crop(rng)
    M = similarity(0.5, 0.3, 300.0, 40.0)
    out = Putback()(bg.copy(), crop, M)
    x0, y0, x1, y1 = crop_bbox(M, 512, bg.shape[:2])
    outside = np.ones(bg.shape[:2], bool)
    outside[y0:y1, x0:x1] = False
    assert np.array_equal(out[outside], bg[outside])
    # the bbox is tight: about the warped crop's size, far smaller than the frame
    side = 512 * 0.5 * (abs(np.cos(0.3)) + abs(np.sin(0.3)))
    assert abs((x1 - x0) - side) <= 4 and abs((y1 - y0) - side) <= 4


def test_crop_fully_outside_leaves_frame(blend_kernel):
    bg = np.full((100, 100, 3), 7, np.uint8)
    crop = np.full((512, 512, 3), 200, np.uint8)
    out = Putback()(bg.copy(), crop, similarity(0.5, 0.0, 500.0, 500.0))
    assert np.array_equal(out, bg)


def test_in_place_and_returned(blend_kernel):
    rng = np.random.default_rng(5)
    bg = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    frame = bg.copy()
    out = Putback()(frame, smooth_crop(rng), similarity(0.4, 0.0, 50.0, 30.0))
    assert out is frame and not np.array_equal(frame, bg)
    # a read-only frame is copied, not written
    ro = bg.copy()
    ro.flags.writeable = False
    out2 = Putback()(ro, smooth_crop(np.random.default_rng(5)), similarity(0.4, 0.0, 50.0, 30.0))
    assert np.array_equal(ro, bg) and out2 is not ro


def test_fallback_equals_kernel_and_warns_once(blend_kernel, monkeypatch):
    rng = np.random.default_rng(6)
    bg = rng.integers(0, 256, (360, 640, 3), dtype=np.uint8)
    crop = smooth_crop(rng)
    M = similarity(0.75, -0.25, 200.0, 30.0)
    with_kernel = Putback()(bg.copy(), crop, M)
    monkeypatch.setattr(pb_mod, "_blend", None)
    monkeypatch.setattr(pb_mod, "_warned_fallback", False)
    with pytest.warns(RuntimeWarning, match="not built"):
        fallback = Putback()(bg.copy(), crop, M)
    assert np.abs(fallback.astype(np.int16) - with_kernel.astype(np.int16)).max() <= 1
    assert np.mean(fallback == with_kernel) > 0.99
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Putback()(bg.copy(), crop, M)     # no second warning


def test_uint8_mask_kernel_matches_numpy(blend_kernel):
    rng = np.random.default_rng(7)
    frame = rng.integers(0, 256, (50, 60, 3), dtype=np.uint8)
    crop = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    mask = rng.integers(0, 256, (30, 40), dtype=np.uint8)
    mask[0, :5] = 0
    mask[1, :5] = 255
    a, b = frame.copy(), frame.copy()
    pb_mod.blend_roi(crop, mask, a, 5, 7, use_kernel=True)
    pb_mod.blend_roi(crop, mask, b, 5, 7, use_kernel=False)
    assert np.abs(a.astype(np.int16) - b).max() <= 1
    assert np.array_equal(a[5, 7:12], frame[5, 7:12]) and np.array_equal(a[6, 7:12], crop[1, :5])
    assert np.array_equal(a[:5], frame[:5]) and np.array_equal(a[:, :7], frame[:, :7])


def test_kernel_rejects_region_outside_frame(blend_kernel):
    frame = np.zeros((10, 10, 3), np.uint8)
    with pytest.raises(ValueError):
        blend_kernel.blend_roi_f32(np.zeros((5, 5, 3), np.uint8), np.zeros((5, 5), np.float32), frame, 8, 0)


def test_repeated_matrix_reuses_mask_correctly(blend_kernel):
    rng = np.random.default_rng(8)
    putback = Putback()
    M = similarity(0.6, 0.1, 100.0, 50.0)
    for _ in range(3):
        bg = rng.integers(0, 256, (360, 640, 3), dtype=np.uint8)
        crop = smooth_crop(rng)
        assert np.abs(putback(bg.copy(), crop, M).astype(np.int16) - reference_putback(bg, crop, M)).max() <= 1
    bg = rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)   # same matrix, other frame size
    crop = smooth_crop(rng)
    assert np.abs(putback(bg.copy(), crop, M).astype(np.int16) - reference_putback(bg, crop, M)).max() <= 1


def test_feathered_mask_profile():
    m = feathered_mask(512)
    assert m.shape == (512, 512) and m.dtype == np.float32
    assert np.all(m[26:486, 26:486] == 1.0)                       # inner 460x460 (90 %)
    assert m[0].max() == 0.0 and m[:, 0].max() == 0.0 and m[-1].max() == 0.0 and m[:, -1].max() == 0.0
    np.testing.assert_allclose(m[:26, 256], np.linspace(0, 1, 26), atol=1e-6)   # linear ramp
    np.testing.assert_allclose(m[256, 486:], np.linspace(1, 0, 26), atol=1e-6)
    assert np.array_equal(m, m[::-1]) and np.array_equal(m, m.T)
    # rounded corner: on the diagonal the mask falls faster than along an edge
    assert m[10, 10] < m[10, 256] and m[10, 10] == pytest.approx(1 - np.hypot(15 / 25, 15 / 25), abs=1e-6)
    assert m[0, 25] == 0.0 and m[5, 5] == 0.0


def test_bad_inputs():
    with pytest.raises(ValueError):
        Putback()(np.zeros((10, 10, 3), np.uint8), np.zeros((256, 256, 3), np.uint8), np.eye(3))
    with pytest.raises(ValueError):
        Putback()(np.zeros((10, 10), np.uint8), np.zeros((512, 512, 3), np.uint8), np.eye(3))
