"""Eye features: Ditto's logic vectors and hand-made eyes."""

import numpy as np
import pytest

from conftest import assert_close_to_ref
from ditto_fast.face.eyes import eye_features


def test_eye_vectors(logic_vectors):
    eye_open, eye_ball = eye_features(logic_vectors["eyes.in.landmarks478"])
    assert eye_open.shape == (4, 2) and eye_ball.shape == (4, 6)
    assert_close_to_ref(eye_open, logic_vectors["eyes.out.eye_open"], "eye_open")
    assert_close_to_ref(eye_ball, logic_vectors["eyes.out.eye_ball"], "eye_ball")
    # eye_ball is ~1e-2 in size: hold it to its own scale, not only the absolute parity tolerance.
    np.testing.assert_allclose(eye_open, logic_vectors["eyes.out.eye_open"], rtol=1e-5)
    np.testing.assert_allclose(eye_ball, logic_vectors["eyes.out.eye_ball"], atol=1e-7, rtol=1e-4)


def _face(lid_gap: float, iris_dx: float = 0.0) -> np.ndarray:
    """Two eyes 0.1 wide; each lid pair `lid_gap` apart; the left iris shifted by iris_dx."""
    lmk = np.zeros((1, 478, 3), dtype=np.float32)
    for (outer, inner), lids, iris, cx in (
        ((33, 133), ((145, 159), (144, 160), (153, 158)), 468, 0.35),
        ((263, 362), ((374, 386), (373, 387), (380, 385)), 473, 0.65),
    ):
        sign = -1 if cx < 0.5 else 1                       # outer corners away from the nose
        lmk[0, outer] = (cx + sign * 0.05, 0.4, 0)
        lmk[0, inner] = (cx - sign * 0.05, 0.4, 0)
        for lo, up in lids:
            lmk[0, lo] = (cx, 0.4 + lid_gap / 2, 0)
            lmk[0, up] = (cx, 0.4 - lid_gap / 2, 0)
        lmk[0, iris] = (cx + (iris_dx if iris == 468 else 0), 0.4, 0)
    return lmk


def test_open_eye_beats_closed_eye():
    open_, ball = eye_features(_face(0.03))
    closed, _ = eye_features(_face(0.002))
    np.testing.assert_allclose(open_, [[0.9, 0.9]], rtol=1e-5)          # 3 * 0.03 / 0.1
    np.testing.assert_allclose(closed, [[0.06, 0.06]], rtol=1e-4)
    np.testing.assert_allclose(ball, 0, atol=1e-7)                     # centred irises: no movement


def test_iris_movement():
    _, ball = eye_features(_face(0.03, iris_dx=0.01))
    # Layout [x_L, x_R, y_L, y_R, z_L, z_R]: the left iris moved inwards (+x, away from its outer
    # corner at -x): unit(+x) - unit(-x) = (2, 0, 0), times the 0.01 offset.
    np.testing.assert_allclose(ball[0], [0.02, 0, 0, 0, 0, 0], atol=1e-6)
    _, out = eye_features(_face(0.03, iris_dx=-0.01))
    assert out[0, 0] == pytest.approx(0.0, abs=1e-6)   # towards the outer corner cancels by construction
