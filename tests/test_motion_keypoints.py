"""Motion vector <-> info, bins -> degrees, rotation and keypoint transform: logic vectors and hand cases."""

import numpy as np
import pytest
import torch

from conftest import assert_close_to_ref
from ditto_fast.motion.keypoints import (
    bins_to_degrees, info_to_motion, motion_to_info, rotation_matrix, transform_keypoints,
)

KEYS = ("scale", "pitch", "yaw", "roll", "t", "exp")


def _source(v):
    return {k.split(".", 1)[1]: v[k] for k in v if k.startswith("source_info.")}


def test_motion_to_info_vectors(logic_vectors):
    v = logic_vectors
    batch = motion_to_info(v["convert.in.motion"])
    for k in KEYS:
        assert_close_to_ref(batch[k], v[f"convert.out.{k}"], f"convert {k}")
    for i, m in enumerate(v["convert.in.motion"]):      # one [265] vector at a time -> [1, dim]
        one = motion_to_info(m)
        assert list(one) == list(KEYS)
        for k in KEYS:
            assert one[k].shape == (1, v[f"convert.out.{k}"].shape[1])
            np.testing.assert_array_equal(one[k], v[f"convert.out.{k}"][i:i + 1])


def test_info_to_motion_vector(logic_vectors):
    got = info_to_motion(_source(logic_vectors))           # kp is present and ignored
    assert got.shape == (265,)
    assert_close_to_ref(got, logic_vectors["convert.out.source_motion"], "source_motion")


def test_round_trip_numpy_and_torch(logic_vectors):
    m = logic_vectors["convert.in.motion"]
    np.testing.assert_allclose(info_to_motion(motion_to_info(m)), m, atol=1e-6)   # scale +1 -1 rounds
    mt = torch.from_numpy(m)
    back = info_to_motion(motion_to_info(mt))
    assert isinstance(back, torch.Tensor)
    torch.testing.assert_close(back, mt)
    np.testing.assert_allclose(info_to_motion(motion_to_info(m[3])), m[3], atol=1e-6)


def test_degrees_vector(logic_vectors):
    got = bins_to_degrees(logic_vectors["source_info.pitch"])
    assert got.shape == (1,)
    np.testing.assert_allclose(got, logic_vectors["degrees.out.pitch"], atol=1e-4)


def test_degrees_hand_cases():
    peaked = np.full((3, 66), -1e4, dtype=np.float32)
    for row, b in enumerate((0, 33, 65)):
        peaked[row, b] = 0
    np.testing.assert_allclose(bins_to_degrees(peaked), [-97.5, 1.5, 97.5], atol=1e-4)
    np.testing.assert_allclose(bins_to_degrees(np.zeros((1, 66))), [0.0], atol=1e-4)   # uniform: centre
    two = np.full((1, 66), -1e4, dtype=np.float32)
    two[0, [10, 12]] = 0                                                               # halfway: bin 11
    np.testing.assert_allclose(bins_to_degrees(two), [11 * 3 - 97.5], atol=1e-4)


def test_transform_vector(logic_vectors):
    got = transform_keypoints(_source(logic_vectors))
    assert got.shape == (1, 21, 3) and got.dtype == np.float32
    assert_close_to_ref(got, logic_vectors["transform.out.x_s"], "transform x_s")
    np.testing.assert_allclose(got, logic_vectors["transform.out.x_s"], atol=1e-5)


@pytest.mark.parametrize("pitch,yaw,roll,point,expected", [
    (0, 0, 0, (1, 2, 3), (1, 2, 3)),            # identity
    (0, 90, 0, (1, 0, 0), (0, 0, -1)),          # yaw turns +x towards -z
    (0, 90, 0, (0, 0, 1), (1, 0, 0)),
    (90, 0, 0, (0, 1, 0), (0, 0, 1)),           # pitch turns +y towards +z
    (0, 0, 90, (1, 0, 0), (0, 1, 0)),           # roll turns +x towards +y
    (0, 0, 180, (1, 2, 0), (-1, -2, 0)),
])
def test_rotation_hand_cases(pitch, yaw, roll, point, expected):
    rot = rotation_matrix(np.array([pitch]), np.array([yaw]), np.array([roll]))
    assert rot.shape == (1, 3, 3)
    np.testing.assert_allclose(np.array([point], dtype=np.float32) @ rot[0], [expected], atol=1e-6)


def test_rotation_order_roll_yaw_pitch():
    # p @ R == (Rz(roll) Ry(yaw) Rx(pitch) p^T)^T: pitch is applied first, roll last.
    p, y, r = np.array([30.0]), np.array([-20.0]), np.array([10.0])
    rot = rotation_matrix(p, y, r)[0]
    composed = rotation_matrix(p, 0 * y, 0 * r)[0] @ rotation_matrix(0 * p, y, 0 * r)[0] @ rotation_matrix(0 * p, 0 * y, r)[0]
    np.testing.assert_allclose(rot, composed, atol=1e-6)
    np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-6)
    assert np.linalg.det(rot) == pytest.approx(1.0, abs=1e-5)


def test_transform_hand_cases():
    kp = np.zeros((2, 21, 3), dtype=np.float32)
    kp[:, 0] = (1, 0, 0)
    exp = np.zeros((2, 63), dtype=np.float32)
    exp[:, 1] = 0.5                                         # keypoint 0, y
    info = {"kp": kp.reshape(2, 63), "exp": exp, "scale": np.array([[2.0], [1.0]]),
            "t": np.array([[0.1, 0.2, 9.0], [0.0, 0.0, 0.0]]),
            "pitch": np.array([0.0, 0.0]), "yaw": np.array([0.0, 90.0]), "roll": np.array([0.0, 0.0])}
    out = transform_keypoints(info)
    assert out.shape == (2, 21, 3)
    np.testing.assert_allclose(out[0, 0], [2 * 1 + 0.1, 2 * 0.5 + 0.2, 0.0], atol=1e-6)   # t's z dropped
    np.testing.assert_allclose(out[0, 1], [0.1, 0.2, 0.0], atol=1e-6)
    np.testing.assert_allclose(out[1, 0], [0.0, 0.5, -1.0], atol=1e-6)                   # yaw 90 then + exp


def test_the_keypoint_parts_are_named_in_one_module():
    """x_s_info's part names are listed once (core/keypoint_info.py); the motion vector's layout is made from them,
    in the LMDM's order, and no other module lists four or more of them."""
    import ast

    from conftest import REPO
    from ditto_fast.core.keypoint_info import X_S_INFO_KEYS
    from ditto_fast.motion.keypoints import MOTION_DIM, MOTION_LAYOUT

    assert [k for k, _ in MOTION_LAYOUT] == ["scale", "pitch", "yaw", "roll", "t", "exp"]    # Ditto's order
    assert sum(w for _, w in MOTION_LAYOUT) == MOTION_DIM
    listed = []
    for path in (REPO / "ditto_fast").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                names = {n.value for n in items if isinstance(n, ast.Constant) and n.value in X_S_INFO_KEYS}
                if len(names) >= 4:
                    listed.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert [where.split(":")[0] for where in listed] == ["ditto_fast/core/keypoint_info.py"], listed
