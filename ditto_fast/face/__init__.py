"""Face stage: mediapipe landmarks, crop geometry, eye features."""

from ditto_fast.face.eyes import eye_features

__all__ = ["eye_features"]
