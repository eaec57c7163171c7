"""Putback geometry: the feathered mask, the face box, the kernel's checks; the full-frame float reference
and test crops the yuv420p paste tests (test_render_yuv) compare against."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from ditto_fast.render import putback as pb_mod
from ditto_fast.render.putback import crop_bbox, feathered_mask

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


def test_crop_bbox_is_tight_and_clipped():
    M = similarity(0.5, 0.3, 300.0, 40.0)
    x0, y0, x1, y1 = crop_bbox(M, 512, (360, 640))
    side = 512 * 0.5 * (abs(np.cos(0.3)) + abs(np.sin(0.3)))     # about the warped crop's size
    assert abs((x1 - x0) - side) <= 4 and abs((y1 - y0) - side) <= 4
    assert crop_bbox(similarity(0.9, 0.2, -180.0, -120.0), 512, (360, 640))[:2] == (0, 0)
    assert crop_bbox(similarity(0.5, 0.0, 500.0, 500.0), 512, (100, 100)) is None


def test_kernel_rejects_bad_regions(blend_kernel):
    mask = feathered_mask(512)
    inv = np.array([1.0, 0, 0, 0, 1.0, 0])
    rect = np.array([26.0, 485.0, 26.0, 485.0])
    planes = np.zeros((1, 10, 10), np.uint8)
    with pytest.raises(ValueError, match="outside the frame"):
        blend_kernel.blend_masked_planes(np.zeros((5, 5, 1), np.uint8), mask, inv, rect, rect, planes, 8, 0)
    with pytest.raises(ValueError, match="planes"):
        blend_kernel.blend_masked_planes(np.zeros((5, 5, 2), np.uint8), mask, inv, rect, rect, planes, 0, 0)
    with pytest.raises(ValueError, match="6 values"):
        blend_kernel.blend_masked_planes(np.zeros((5, 5, 1), np.uint8), mask, inv[:4], rect, rect, planes, 0, 0)


