"""Single frames of a finished video, by frame number: one short ffmpeg seek per frame."""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np

from ..avatar.plate import probe_video
from ..errors import AvatarError, InputError
from ..ffpipe import RawVideoPipe, TruncatedFrame


def video_frames(path: str | os.PathLike, indices: np.ndarray,
                 rate: Fraction | None = None) -> list[np.ndarray]:
    """Frames [H, W, 3] uint8 RGB of `path` at frame numbers `indices` (rate: the video's, probed if not given).

    Each frame is an accurate input seek to half a frame before its time, so frame i is the first
    frame ffmpeg keeps; a number past the end gives the last frame.
    """
    try:
        (w, h), probed = probe_video(path)
    except AvatarError:
        raise InputError(f"{path}: not a readable video") from None
    rate = Fraction(rate) if rate is not None else probed
    out = []
    for i in np.asarray(indices, dtype=np.int64).reshape(-1):
        args = ["-ss", f"{float((int(i) - Fraction(1, 2)) / rate):.6f}"] if i > 0 else []
        buf = np.empty((h, w, 3), np.uint8)
        pipe = RawVideoPipe([*args, "-i", os.fspath(path), "-map", "0:v:0", "-frames:v", "1",
                             "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"])
        try:
            got = pipe.read_into(buf)
        except TruncatedFrame:
            got = False
        finally:
            pipe.close()
        if not got:
            if out:       # past the end (the seek found nothing): repeat the last frame read
                out.append(out[-1].copy())
                continue
            raise InputError(f"{path}: no video frame could be read at frame {int(i)}; is the file complete?")
        out.append(buf)
    return out
