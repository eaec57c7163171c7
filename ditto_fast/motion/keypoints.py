"""Motion vectors <-> keypoint infos, head-pose bins -> degrees, implicit keypoint transform (numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ditto_fast.core.keypoint_info import MOTION_KEYS, NUM_BINS, NUM_KP, X_S_INFO_WIDTHS

MOTION_DIM = 265
# The layout of one motion vector (the LMDM's order): (key, width), x_s_info's parts but kp. `scale` is stored as
# scale - 1.
MOTION_LAYOUT: tuple[tuple[str, int], ...] = tuple((key, X_S_INFO_WIDTHS[key]) for key in MOTION_KEYS)
# The leading dims of a motion vector that are smoothed over time (scale, pose, translation; not exp).
SMOOTHED_DIMS = MOTION_DIM - 3 * NUM_KP


def _np32(x: Any) -> np.ndarray:
    """A float32 numpy array from a numpy array, torch tensor or number."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def motion_to_info(m: Any) -> dict:
    """Split motion vectors [265] or [B,265] into {scale [B,1], pitch, yaw, roll [B,66], t [B,3], exp [B,63]}.

    Works on numpy arrays and torch tensors alike; the values keep the input's type.
    """
    m = m.reshape(-1, MOTION_DIM)  # [B, 265]
    info, start = {}, 0
    for key, width in MOTION_LAYOUT:
        info[key] = m[:, start:start + width]
        start += width
    info["scale"] = info["scale"] + 1
    return info


def info_to_motion(info: dict) -> Any:
    """Join an info dict (keys as motion_to_info; `kp` ignored) into motion vectors: [265] for B=1, else [B,265]."""
    parts = []
    for key, width in MOTION_LAYOUT:
        v = info[key].reshape(-1, width)
        parts.append(v - 1 if key == "scale" else v)
    if hasattr(parts[0], "detach"):
        import torch

        out = torch.cat(parts, dim=1)
    else:
        out = np.concatenate([np.asarray(p) for p in parts], axis=1)
    return out[0] if out.shape[0] == 1 else out  # [265] or [B, 265]


def bins_to_degrees(logits: Any) -> np.ndarray:
    """Head-pose bin logits [B,66] -> degrees [B]: softmax expectation of bin index * 3 - 97.5."""
    x = _np32(logits).reshape(-1, NUM_BINS).astype(np.float64)
    x = np.exp(x - x.max(axis=1, keepdims=True))
    p = x / x.sum(axis=1, keepdims=True)
    # an elementwise product and a row sum (not a matrix-vector product, whose summation order depends on
    # B): each row's degrees are the same whether it comes alone or in a batch
    return ((p * np.arange(NUM_BINS, dtype=np.float64)).sum(axis=1) * 3.0 - 97.5).astype(np.float32)  # [B]


def pose_degrees(v: Any) -> np.ndarray:
    """Degrees [B] from either bin logits [B,66] or values already in degrees ([B] or [B,1])."""
    a = _np32(v)
    if a.ndim == 2 and a.shape[1] == NUM_BINS:
        return bins_to_degrees(a)
    return a.reshape(-1)


def rotation_matrix(pitch_deg: Any, yaw_deg: Any, roll_deg: Any) -> np.ndarray:
    """Row-vector rotation matrices [B,3,3] for angles in degrees: (Rz(roll) @ Ry(yaw) @ Rx(pitch))^T.

    A keypoint row p [3] is rotated as p @ R.
    """
    x, y, z = (np.deg2rad(_np32(a).reshape(-1).astype(np.float64)) for a in (pitch_deg, yaw_deg, roll_deg))
    b = x.shape[0]
    rx = np.zeros((b, 3, 3)); ry = np.zeros((b, 3, 3)); rz = np.zeros((b, 3, 3))
    rx[:, 0, 0] = 1
    rx[:, 1, 1], rx[:, 1, 2], rx[:, 2, 1], rx[:, 2, 2] = np.cos(x), -np.sin(x), np.sin(x), np.cos(x)
    ry[:, 1, 1] = 1
    ry[:, 0, 0], ry[:, 0, 2], ry[:, 2, 0], ry[:, 2, 2] = np.cos(y), np.sin(y), -np.sin(y), np.cos(y)
    rz[:, 2, 2] = 1
    rz[:, 0, 0], rz[:, 0, 1], rz[:, 1, 0], rz[:, 1, 1] = np.cos(z), -np.sin(z), np.sin(z), np.cos(z)
    return np.transpose(rz @ ry @ rx, (0, 2, 1)).astype(np.float32)  # [B, 3, 3]


def transform_keypoints(info: dict) -> np.ndarray:
    """Posed keypoints [B,21,3] = scale * (kp @ R + exp) + (tx, ty, 0).

    info: kp [B,63] or [B,21,3], exp [B,63], scale [B,1], t [B,3], and pitch/yaw/roll as
    bin logits [B,66] or degrees [B].
    """
    kp = _np32(info["kp"])
    b = kp.shape[0]
    kp = kp.reshape(b, -1, 3)  # [B, K, 3]
    rot = rotation_matrix(pose_degrees(info["pitch"]), pose_degrees(info["yaw"]), pose_degrees(info["roll"]))
    exp = _np32(info["exp"]).reshape(b, -1, 3)
    scale = _np32(info["scale"]).reshape(b, 1, 1)
    t = _np32(info["t"]).reshape(b, 3)
    out = scale * (kp @ rot + exp)
    out[:, :, :2] += t[:, None, :2]  # z translation is dropped
    return out.astype(np.float32)  # [B, K, 3]
