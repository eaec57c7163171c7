"""The parts of a face's keypoint info (x_s_info) as the motion extractor reads them off a crop: each part's name
and its values per frame, and the parts a motion vector carries, in its order. Registration, the avatar format and
the motion vectors take them from here: the names are listed nowhere else."""

from __future__ import annotations

NUM_KP = 21       # implicit 3D keypoints
NUM_BINS = 66     # head-pose bins per angle
# x_s_info's parts, in the order an avatar keeps them, and each one's values per frame
X_S_INFO_WIDTHS: dict[str, int] = {
    "pitch": NUM_BINS, "yaw": NUM_BINS, "roll": NUM_BINS, "t": 3, "exp": 3 * NUM_KP, "scale": 1, "kp": 3 * NUM_KP,
}
X_S_INFO_KEYS = tuple(X_S_INFO_WIDTHS)
# a motion vector's parts in the LMDM's order: x_s_info's, scale first, without kp (the keypoints are the avatar's)
MOTION_KEYS = ("scale", *(k for k in X_S_INFO_KEYS if k not in ("scale", "kp")))
