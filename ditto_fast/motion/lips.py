"""How far the generated motion opens the mouth: the lip keypoints' vertical spread, frame by frame."""

from __future__ import annotations

import numpy as np

from ditto_fast.motion.keypoints import NUM_KP, motion_to_info
from ditto_fast.motion.stitch import LIP_KP


def lip_opening(motion: np.ndarray, kp: np.ndarray) -> np.ndarray:
    """Lip opening [M] of motion vectors [M, 265] on canonical keypoints kp [63] (the avatar's `sc`).

    The vertical extent of the lip keypoints in kp + exp, before pose and scale: it grows as the lips
    part. In keypoint units; compare frames of one clip with each other, not clips of different avatars.
    """
    exp = motion_to_info(np.asarray(motion, dtype=np.float32))["exp"].reshape(-1, NUM_KP, 3)   # [M, 21, 3]
    y = (np.asarray(kp, dtype=np.float32).reshape(1, NUM_KP, 3) + exp)[:, list(LIP_KP), 1]      # [M, 6]
    return (y.max(1) - y.min(1)).astype(np.float32)
