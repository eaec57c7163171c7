"""Putback geometry: the feathered mask, the face box, the kernel's checks; the full-frame float reference
and test crops the yuv420p paste tests (test_render_yuv) compare against."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ditto_fast.render.putback import crop_bbox, feathered_mask
from support import similarity

REPO = Path(__file__).resolve().parents[1]




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


