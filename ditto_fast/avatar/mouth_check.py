"""Is the source's mouth open? Registration measures it on every frame; an open mouth is warned about
(or refused with --strict), because the source's teeth and lips leak into every rendered frame."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

WHY = "the source's teeth and lips leak into every rendered frame"
_MAX_RANGES = 4


def frame_ranges(frames: np.ndarray, limit: int = _MAX_RANGES) -> str:
    """Frame numbers as ranges, at most `limit` of them: "0-24, 40, 52-60 and 3 more ranges"."""
    frames = np.asarray(frames, dtype=np.int64).reshape(-1)
    if frames.size == 0:
        return "none"
    breaks = np.flatnonzero(np.diff(frames) != 1)
    starts, ends = frames[np.r_[0, breaks + 1]], frames[np.r_[breaks, frames.size - 1]]
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in zip(starts, ends)]
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f" and {more} more range{'s' if more > 1 else ''}" if more > 0 else "")


@dataclass(frozen=True)
class MouthCheck:
    """Per-frame mouth openness [N] and the rule: flagged when frame 0, or more than `max_share` of the
    frames, open beyond `threshold` (inner-lip gap over mouth width)."""

    openness: np.ndarray
    threshold: float
    max_share: float

    @property
    def open_frames(self) -> np.ndarray:
        """Indices [K] of the frames whose mouth is open beyond the threshold."""
        return np.flatnonzero(np.asarray(self.openness) > self.threshold)

    @property
    def share(self) -> float:
        """Fraction of the frames with the mouth open."""
        return len(self.open_frames) / max(1, len(self.openness))

    @property
    def flagged(self) -> bool:
        """True when the source should be warned about (or refused with --strict)."""
        return bool(len(self.openness)) and (bool(self.openness[0] > self.threshold) or self.share > self.max_share)

    def message(self, source: str) -> str:
        """One line: which frames, how open, and why it matters."""
        n, opened = len(self.openness), self.open_frames
        where = f"on {len(opened)} of {n} frames ({frame_ranges(opened)})" if n > 1 else "in the image"
        if n > 1 and opened.size and opened[0] == 0:
            where += ", frame 0 among them"
        return (f"{source}: the mouth is open {where}, lip gap up to {float(np.max(self.openness)):.2f} of the "
                f"mouth's width (threshold {self.threshold:.2f}); {WHY}")

    def record(self) -> dict[str, Any]:
        """What the avatar record keeps: the curve and the rule it was judged by."""
        return {"open": np.asarray(self.openness, np.float32), "threshold": float(self.threshold),
                "max_share": float(self.max_share)}

    def summary(self) -> dict[str, Any]:
        """The figure `avatars show` lists."""
        o = np.asarray(self.openness)
        return {"first_frame": round(float(o[0]), 3), "max": round(float(o.max()), 3),
                "threshold": self.threshold, "open_frames": frame_ranges(self.open_frames, limit=8),
                "open_share": round(self.share, 3), "warning": self.flagged}


def mouth_check_of(record: dict[str, Any]) -> MouthCheck | None:
    """The MouthCheck stored in an avatar record (its "extra"), or None for avatars registered before it."""
    m = record.get("extra", {}).get("mouth")
    if not isinstance(m, dict) or not isinstance(m.get("open"), np.ndarray) or m["open"].size == 0:
        return None
    return MouthCheck(m["open"].astype(np.float32), float(m["threshold"]), float(m["max_share"]))
