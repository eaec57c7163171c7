"""Per-frame motion controls (pose offsets, pose/expression scale, fade, blinks) and their JSON file.

Control file (all keys optional; frame numbers are 0-based output frames, ranges inclusive)::

    {
      "default": {"yaw": 2, "exp_scale": 1.1},
      "frames":  {"10-40": {"yaw": 5}, "41": {"pitch": -3}},
      "fade_in": 10, "fade_out": 10,
      "blinks": [30, 95]
    }

Per-frame keys (`FRAME_KEYS`):
  pitch, yaw, roll   degrees added to the head pose (image avatars; video avatars keep the plate's pose
                     but the offset still applies), -90..90
  pose_scale         multiplies the driven head motion around the source pose (0 = still head), 0..5
  exp_scale          multiplies the driven expression around the source expression (0 = source face,
                     1 = as generated, >1 = exaggerated mouth/eyes), 0..5
  exp_offset         63 numbers added to the expression (21 keypoints x (x, y, z)), each -1..1, for expert tweaks
A range's keys override `default` for its frames; later ranges override earlier ones.
`fade_in`/`fade_out` k: blend from/to the source pose and expression over the first/last k frames
(frame 0 and the last frame are exactly the source). `blinks`: frames where a blink starts; each blink
closes the eyes over `BLINK_PROFILE` (7 frames, fully closed on the third).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ditto_fast.core.errors import InputError
from ditto_fast.core.files import MIB, read_input

FRAME_KEYS = ("pitch", "yaw", "roll", "pose_scale", "exp_scale", "exp_offset")
# allowed values of each per-frame key (inclusive; exp_offset: each of its 63 numbers): wide enough for any
# sensible look, narrow enough that no value can overflow into inf/NaN keypoints downstream
RANGES = {"pitch": (-90.0, 90.0), "yaw": (-90.0, 90.0), "roll": (-90.0, 90.0), "pose_scale": (0.0, 5.0),
          "exp_scale": (0.0, 5.0), "exp_offset": (-1.0, 1.0)}
CONTROLS_MAX_BYTES = 16 * MIB       # kilobytes usually; per-frame offsets for a long programme stay far under this
FILE_KEYS = ("default", "frames", "fade_in", "fade_out", "blinks")
# Eye closure (0 open .. 1 closed) over the frames of one blink, starting at the blink's frame.
BLINK_PROFILE = (0.35, 0.8, 1.0, 0.8, 0.55, 0.3, 0.1)


@dataclass(frozen=True)
class FrameControl:
    """What the controls ask of one frame."""

    pitch: float = 0.0          # degrees added
    yaw: float = 0.0
    roll: float = 0.0
    pose_scale: float = 1.0     # driven pose motion multiplier around the source pose
    exp_scale: float = 1.0      # driven expression multiplier around the source expression
    exp_offset: np.ndarray | None = None  # [63] added to the expression
    fade: float = 1.0           # 1 = driven motion, 0 = the source pose and expression
    eye_closure: float = 0.0    # 0 = eyes as driven, 1 = closed


@dataclass
class Controls:
    """Controls for a render of n_frames frames; `at(i)` gives frame i's FrameControl."""

    n_frames: int
    default: dict = field(default_factory=dict)
    ranges: list[tuple[int, int, dict]] = field(default_factory=list)   # (first, last, keys), inclusive
    fade_in: int = 0
    fade_out: int = 0
    blinks: tuple[int, ...] = ()

    def fade_alpha(self, i: int) -> float:
        """1 inside the render, ramping to 0 at frame 0 (fade in) and at the last frame (fade out)."""
        alpha = 1.0
        if self.fade_in > 0 and i < self.fade_in:
            alpha = min(alpha, max(i, 0) / self.fade_in)
        if self.fade_out > 0:
            last = self.n_frames - 1
            alpha = min(alpha, max(min((last - i) / self.fade_out, 1.0), 0.0))
        return alpha

    def eye_closure(self, i: int) -> float:
        """How closed the eyes are at frame i from the blink schedule (0..1)."""
        c = 0.0
        for start in self.blinks:
            j = i - start
            if 0 <= j < len(BLINK_PROFILE):
                c = max(c, BLINK_PROFILE[j])
        return c

    def at(self, i: int) -> FrameControl:
        """The merged control for frame i."""
        keys = dict(self.default)
        for first, last, over in self.ranges:
            if first <= i <= last:
                keys.update(over)
        if "exp_offset" in keys:
            keys["exp_offset"] = np.asarray(keys["exp_offset"], dtype=np.float32).reshape(63)
        return FrameControl(**keys, fade=self.fade_alpha(i), eye_closure=self.eye_closure(i))


def _bad(path: Path, key: str, why: str) -> InputError:
    return InputError(f"{path}: control key '{key}' {why}; fix it in the control file")


def _number(path: Path, key: str, v: object, allowed: tuple[float, float]) -> float:
    lo, hi = allowed
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise _bad(path, key, f"must be a number in {lo:g}..{hi:g}, got {v!r}")
    return float(v)


def _frame_keys(path: Path, where: str, obj: object) -> dict:
    if not isinstance(obj, dict):
        raise _bad(path, where, "must be an object of per-frame keys")
    out = {}
    for k, v in obj.items():
        name = f"{where}.{k}"
        if k not in FRAME_KEYS:
            raise _bad(path, name, f"is unknown (allowed: {', '.join(FRAME_KEYS)})")
        if k == "exp_offset":
            if not isinstance(v, list) or len(v) != 63:
                raise _bad(path, name, "must be a list of 63 numbers")
            out[k] = [_number(path, name, x, RANGES[k]) for x in v]
        else:
            out[k] = _number(path, name, v, RANGES[k])
    return out


def _frame_index(path: Path, key: str, s: str, n_frames: int) -> int:
    try:
        i = int(s)
    except ValueError:
        raise _bad(path, key, f"has frame {s!r} that is not a whole number") from None
    if not 0 <= i < n_frames:
        raise _bad(path, key, f"has frame {i} outside 0..{n_frames - 1}")
    return i


def _count(path: Path, key: str, v: object, n_frames: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= n_frames:
        raise _bad(path, key, f"must be a whole number of frames in 0..{n_frames}, got {v!r}")
    return v


def parse_controls(data: object, n_frames: int, path: str | Path = "<controls>") -> Controls:
    """Controls from the decoded JSON object; path only names the file in errors."""
    path = Path(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: the control file must hold a JSON object; fix the file")
    for k in data:
        if k not in FILE_KEYS:
            raise _bad(path, k, f"is unknown (allowed: {', '.join(FILE_KEYS)})")
    default = _frame_keys(path, "default", data.get("default", {}))
    frames = data.get("frames", {})
    if not isinstance(frames, dict):
        raise _bad(path, "frames", "must be an object of \"first-last\": {keys}")
    ranges = []
    for span, over in frames.items():
        key = f"frames.{span}"
        a, _, b = str(span).partition("-")
        first = _frame_index(path, key, a.strip(), n_frames)
        last = _frame_index(path, key, b.strip(), n_frames) if b else first
        if last < first:
            raise _bad(path, key, "has its last frame before its first")
        ranges.append((first, last, _frame_keys(path, key, over)))
    blinks = data.get("blinks", [])
    if not isinstance(blinks, list):
        raise _bad(path, "blinks", "must be a list of frame numbers")
    blink_frames = []
    for b in blinks:
        if isinstance(b, bool) or not isinstance(b, int):
            raise _bad(path, "blinks", f"has {b!r} that is not a whole frame number")
        blink_frames.append(_frame_index(path, "blinks", str(b), n_frames))
    return Controls(
        n_frames=n_frames,
        default=default,
        ranges=ranges,
        fade_in=_count(path, "fade_in", data.get("fade_in", 0), n_frames),
        fade_out=_count(path, "fade_out", data.get("fade_out", 0), n_frames),
        blinks=tuple(sorted(blink_frames)),
    )


def read_control_file(path: Path) -> bytes:
    """The bytes of a control file; InputError naming it when it is missing, unreadable, not a regular file or
    larger than a control file can be."""
    return read_input(path, CONTROLS_MAX_BYTES, "a JSON control file")


def load_controls(path: str | Path, n_frames: int, file_bytes: bytes | None = None) -> Controls:
    """Read (unless `file_bytes` holds it already) and check a JSON control file for a render of n_frames frames."""
    path = Path(path)
    try:
        data = json.loads(read_control_file(path) if file_bytes is None else file_bytes)
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: cannot read the control file ({e}); check the file") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}); fix the file") from None
    except RecursionError:
        raise InputError(f"{path}: not valid JSON (nested too deep); fix the file") from None
    return parse_controls(data, n_frames, path)
