"""Face stage: mediapipe landmarks, crop geometry, eye features."""

from .eyes import eye_features

__all__ = ["eye_features"]
