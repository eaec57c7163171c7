"""Eye features from mediapipe's 478 face-mesh landmarks: eye openness and iris movement, per eye."""

from __future__ import annotations

import numpy as np

EPS = 1e-8
# Per eye (left, right in mediapipe's numbering): corners (outer, inner), three lid pairs (lower, upper), iris.
EYE_CORNERS = ((33, 133), (263, 362))
EYE_LIDS = (((145, 159), (144, 160), (153, 158)), ((374, 386), (373, 387), (380, 385)))
IRIS = (468, 473)


def _norm(v: np.ndarray) -> np.ndarray:
    return np.sqrt((v ** 2).sum(-1))


def _unit(v: np.ndarray) -> np.ndarray:
    return v / (_norm(v)[..., None] + EPS)


def eye_features(lmk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(eye_open [B,2], eye_ball [B,6]) from landmarks [B,478,3] (mediapipe-normalised coordinates).

    eye_open: sum of the three lid distances over the eye width, per eye (left, right).
    eye_ball: the iris's offset from the eye centre with the outer-corner direction taken away,
    [x_L, x_R, y_L, y_R, z_L, z_R] (coordinate-major, as Ditto's condition vector orders it).
    """
    lmk = np.asarray(lmk, dtype=np.float32)  # [B, 478, 3]
    opens, moves = [], []
    for (outer, inner), lids, iris in zip(EYE_CORNERS, EYE_LIDS, IRIS):
        width = _norm(lmk[:, outer] - lmk[:, inner])                          # [B]
        lid_sum = sum(_norm(lmk[:, lo] - lmk[:, up]) for lo, up in lids)      # [B]
        opens.append(lid_sum / (width + EPS))
        centre = (lmk[:, outer] + lmk[:, inner]) * 0.5                        # [B, 3]
        offset = lmk[:, iris] - centre                                        # [B, 3]
        direction = _unit(offset) - _unit(lmk[:, outer] - lmk[:, inner])
        moves.append(direction * _norm(offset)[:, None])                      # [B, 3]
    eye_open = np.stack(opens, -1)                                            # [B, 2]
    eye_ball = np.stack(moves, -1).reshape(-1, 6)                             # [B, 3, 2] -> [B, 6]
    return eye_open.astype(np.float32), eye_ball.astype(np.float32)
