"""Registration source reading: one ffmpeg pass gives the RGB frames (into a ring of buffers) and the plate."""

from __future__ import annotations

from collections import deque

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.avatar.source import SourceFrames, open_source
from ditto_fast.ffpipe import RawVideoPipe
from ditto_fast.render.plate import PLATE_KEYINT, PlateReader


def _reference_frames(path, size) -> list[np.ndarray]:
    """The source decoded independently (imageio-ffmpeg's reader, same 25 fps + area scale)."""
    w, h = size
    gen = imageio_ffmpeg.read_frames(str(path), output_params=["-vf", f"fps=25,scale={w}:{h}:flags=area"])
    next(gen)
    return [np.frombuffer(b, np.uint8).reshape(h, w, 3).copy() for b in gen]


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * np.log10(255.0 ** 2 / max(mse, 1e-12))


def _count_frames(path) -> int:
    """Frames in a video, decoded by ffmpeg (shrunk to 64x64 gray to keep it cheap)."""
    pipe = RawVideoPipe(["-i", str(path), "-vf", "scale=64:64", "-f", "rawvideo", "-pix_fmt", "gray", "pipe:1"])
    buf = np.empty((64, 64), np.uint8)
    n = 0
    try:
        while pipe.read_into(buf):
            n += 1
    finally:
        pipe.close()
    return n


def test_frame_stays_valid_while_ring_minus_one_more_are_read_and_plate_matches(anchor_video, tmp_path):
    info, _ = open_source(anchor_video, 1280)          # resized: 1280x720
    assert info.size == (1280, 720)
    ref = _reference_frames(anchor_video, info.size)
    plate = tmp_path / "plate.mp4"
    held: deque[tuple[int, np.ndarray]] = deque()
    with SourceFrames(info, ring=3, plate=plate) as src:
        for i, frame in enumerate(src):
            assert frame.shape == (720, 1280, 3) and frame.dtype == np.uint8
            held.append((i, frame))
            if len(held) > 3:                          # ring 3: this frame and the two before are intact
                held.popleft()
            for j, f in held:
                np.testing.assert_array_equal(f, ref[j])
        src.finish()
    assert src.count == len(ref) == 25
    with PlateReader(plate, src.count) as reader:
        for k in (0, 7, 24, 13):                       # includes a backward seek
            assert _psnr(reader.frame(k), ref[k]) > 40.0
    assert _count_frames(plate) == 25


def test_max_frames_limits_frames_and_plate(anchor_video, tmp_path):
    info, _ = open_source(anchor_video, 1920)
    plate = tmp_path / "plate.mp4"
    with SourceFrames(info, max_frames=7, ring=2, plate=plate) as src:
        n = sum(1 for _ in src)
        src.finish()
    assert n == 7 and _count_frames(plate) == 7


def test_without_plate_and_image_refused(anchor_video, tmp_path):
    info, _ = open_source(anchor_video, 1920)
    with SourceFrames(info, max_frames=3) as src:
        assert sum(1 for _ in src) == 3
        src.finish()
    info.is_image = True
    with pytest.raises(ValueError, match="image"):
        SourceFrames(info)


def test_plate_keyframes_allow_exact_seeks(anchor_video, tmp_path):
    """A plate longer than one keyframe interval: a block after the first decodes exactly after a seek."""
    from synthetic import write_anchor_video

    src_path = write_anchor_video(tmp_path / "long.mp4", PLATE_KEYINT + 10, size=(640, 360), face_px=80)
    info, _ = open_source(src_path, 640)
    ref = _reference_frames(src_path, info.size)
    plate = tmp_path / "plate.mp4"
    with SourceFrames(info, ring=2, plate=plate) as src:
        for _ in src:
            pass
        src.finish()
    with PlateReader(plate, src.count) as reader:
        for k in (PLATE_KEYINT + 3, 2, PLATE_KEYINT):
            assert _psnr(reader.frame(k), ref[k]) > 40.0
