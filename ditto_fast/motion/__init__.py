"""Audio-to-motion: conditions, LMDM window sampling, motion <-> keypoint conversion, stitching, controls."""

from ditto_fast.motion.keypoints import bins_to_degrees, info_to_motion, motion_to_info, rotation_matrix, transform_keypoints
from ditto_fast.motion.stitch import MotionStitch

__all__ = ["bins_to_degrees", "info_to_motion", "motion_to_info", "rotation_matrix", "transform_keypoints",
           "MotionStitch"]
