"""Mouth openness from mediapipe's 478 face-mesh landmarks: the inner-lip gap over the mouth's width."""

from __future__ import annotations

import numpy as np

# Inner-lip point pairs (upper, lower) at the middle and either side of it; the outer mouth corners.
INNER_LIP_PAIRS = ((13, 14), (82, 87), (312, 317))
MOUTH_CORNERS = (61, 291)
EPS = 1e-8


def mouth_openness(lmk: np.ndarray) -> np.ndarray:
    """Openness [B] from landmarks [B, 478, 2|3]: mean inner-lip gap / corner-to-corner width (closed ~0).

    A ratio of lengths in the image plane, so any similarity-related coordinates (frame pixels, crop
    pixels, mediapipe-normalised crop coordinates) give the same value.
    """
    pts = np.asarray(lmk, dtype=np.float64)[..., :2]                       # [B, 478, 2]
    gaps = [np.hypot(*(pts[:, lo] - pts[:, up]).T) for up, lo in INNER_LIP_PAIRS]
    width = np.hypot(*(pts[:, MOUTH_CORNERS[0]] - pts[:, MOUTH_CORNERS[1]]).T)
    return (np.mean(gaps, axis=0) / (width + EPS)).astype(np.float32)       # [B]
