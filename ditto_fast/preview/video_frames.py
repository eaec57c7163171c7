"""Single frames of a finished video, by frame number.

Up to SEQUENTIAL_LIMIT frames in, one ffmpeg process decodes from the start and passes on only the
frames asked for (a select filter); further in, each frame is an accurate seek of its own, which
decodes at most from the keyframe before it (an encoder's default interval is 250 frames).
"""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np

from ditto_fast.avatar.plate import probe_video
from ditto_fast.core.errors import AvatarError, InputError
from ditto_fast.media.ffpipe import RawVideoPipe, TruncatedFrame

SEQUENTIAL_LIMIT = 1500


def _read(args: list[str], count: int, size: tuple[int, int]) -> list[np.ndarray]:
    """Up to `count` RGB frames [H, W, 3] that ffmpeg with `args` (ending in pipe:1) writes."""
    w, h = size
    pipe = RawVideoPipe(args)
    frames: list[np.ndarray] = []
    try:
        for _ in range(count):
            buf = np.empty((h, w, 3), np.uint8)
            if not pipe.read_into(buf):
                break
            frames.append(buf)
    except TruncatedFrame:
        pass
    finally:
        pipe.close()
    return frames


def video_frames(path: str | os.PathLike, indices: np.ndarray,
                 rate: Fraction | None = None) -> list[np.ndarray]:
    """Frames [H, W, 3] uint8 RGB of `path` at the increasing frame numbers `indices` (rate: the video's,
    probed if not given); a number past the end gives the last frame read."""
    try:
        size, probed, _, _ = probe_video(path)
    except AvatarError:
        raise InputError(f"{path}: not a readable video") from None
    rate = Fraction(rate) if rate is not None else probed
    idx = [int(i) for i in np.asarray(indices, dtype=np.int64).reshape(-1)]
    tail = ["-map", "0:v:0", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"]
    if idx and idx[-1] < SEQUENTIAL_LIMIT:
        pick = "+".join(f"eq(n\\,{i})" for i in idx)
        out = _read(["-i", os.fspath(path), "-vf", f"select={pick}", "-fps_mode", "passthrough",
                     "-frames:v", str(len(idx)), *tail], len(idx), size)
    else:
        out = []
        for i in idx:
            seek = ["-ss", f"{float((i - Fraction(1, 2)) / rate):.6f}"] if i > 0 else []
            got = _read([*seek, "-i", os.fspath(path), "-frames:v", "1", *tail], 1, size)
            if not got and not out:
                break
            out += got or out[-1:]
    if not out:
        raise InputError(f"{path}: no video frame could be read; is the file complete?")
    return out + [out[-1]] * (len(idx) - len(out))
