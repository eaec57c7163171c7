"""The few mesh points an avatar keeps per frame (for its preview): those the crop, eye and mouth features rest on.

Kept in crop pixels (0..512, float16: a quarter pixel or better inside the crop), so a frame costs
KEPT_POINTS.size * 4 bytes in the record, not the whole 478-point mesh.
"""

from __future__ import annotations

import numpy as np

from ditto_fast.face.crop import CONTOUR, MOUTH_CORNERS as CROP_MOUTH_CORNERS
from ditto_fast.face.eyes import EYE_CORNERS, EYE_LIDS, IRIS
from ditto_fast.face.mouth import INNER_LIP_PAIRS, MOUTH_CORNERS

# name -> mediapipe indices; the groups the preview colours apart
GROUPS: dict[str, tuple[int, ...]] = {
    "contour": CONTOUR,
    "brows": (70, 105, 107, 336, 334, 300),
    "nose": (168, 6, 4, 1),
    "eyes": tuple(i for corners, lids in zip(EYE_CORNERS, EYE_LIDS)
                  for i in (*corners, *(k for pair in lids for k in pair))) + IRIS,
    "mouth": tuple(dict.fromkeys((*MOUTH_CORNERS, *CROP_MOUTH_CORNERS, 0, 17,
                                  *(k for pair in INNER_LIP_PAIRS for k in pair)))),
}
KEPT_POINTS = np.array([i for g in GROUPS.values() for i in g], dtype=np.int16)   # [K]


def kept_points(lmk_crop: np.ndarray, dsize: int) -> np.ndarray:
    """The kept points [K, 2] float16 in crop pixels from landmarks [478, 2|3] normalised by the crop side."""
    return (np.asarray(lmk_crop, dtype=np.float64)[KEPT_POINTS.astype(np.int64), :2] * dsize).astype(np.float16)


def group_of(index: np.ndarray) -> list[str]:
    """The group name of each mediapipe index in `index` [K] ("other" for one in no group)."""
    lookup = {i: name for name, members in GROUPS.items() for i in members}
    return [lookup.get(int(i), "other") for i in np.asarray(index).reshape(-1)]
