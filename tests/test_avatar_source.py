"""Registration source reading: one ffmpeg pass gives the yuv420p frames (into a ring of buffers) and the plate."""

from __future__ import annotations

import subprocess
from collections import deque

import cv2
import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.avatar.plate import PLATE_KEYINT, PlateReader
from ditto_fast.avatar.source import SourceFrames, open_source
from ditto_fast.media.ffpipe import RawVideoPipe
from ditto_fast.media.yuv import YuvFrame


def _reference_frames(path, size) -> list[np.ndarray]:
    """The source decoded independently (imageio-ffmpeg's reader, same 25 fps + area scale)."""
    w, h = size
    gen = imageio_ffmpeg.read_frames(str(path), output_params=["-vf", f"fps=25,scale={w}:{h}:flags=area"])
    next(gen)
    return [np.frombuffer(b, np.uint8).reshape(h, w, 3).copy() for b in gen]


def _reference_yuv(path, size) -> list[np.ndarray]:
    """The source decoded independently to yuv420p (same 25 fps + area scale): [H * 3/2, W] per frame."""
    w, h = size
    pipe = RawVideoPipe(["-i", str(path), "-vf", f"fps=25,scale={w}:{h}:flags=area", "-f", "rawvideo",
                         "-pix_fmt", "yuv420p", "pipe:1"])
    frames = []
    try:
        while pipe.read_into(buf := np.empty((h * 3 // 2, w), np.uint8)):
            frames.append(buf)
    finally:
        pipe.close()
    return frames


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


@pytest.mark.slow
def test_frame_stays_valid_while_ring_minus_one_more_are_read_and_plate_matches(anchor_video, tmp_path):
    info, _ = open_source(anchor_video, 1280)          # resized: 1280x720
    assert info.size == (1280, 720)
    ref = _reference_frames(anchor_video, info.size)
    ref_yuv = _reference_yuv(anchor_video, info.size)
    plate = tmp_path / "plate.mp4"
    held: deque[tuple[int, YuvFrame]] = deque()
    with SourceFrames(info, ring=3, plate=plate, ahead=4) as src:
        for i, frame in enumerate(src):
            assert frame.shape == (720, 1280, 3) and frame.buffer.shape == (1080, 1280)
            held.append((i, frame))
            if len(held) > 3:                          # ring 3: this frame and the two before are intact
                held.popleft()
            for j, f in held:
                np.testing.assert_array_equal(f.buffer, ref_yuv[j])
            assert _psnr(frame.rgb(), ref[i]) > 40.0   # RGB as ffmpeg's own reader gives it
        src.finish()
    assert src.count == len(ref) == len(ref_yuv) == 25
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


@pytest.mark.slow
def test_ffmpeg_works_ahead_of_the_reader(tmp_path):
    """With `ahead` frames of queue, ffmpeg keeps decoding and encoding the plate while the reader is busy
    elsewhere (most of the plate is written after one frame is read); with a queue of 1 it stops a few frames
    ahead (measured with the lossless plate: 98% and 12% of the plate's bytes)."""
    import time

    from synthetic import write_anchor_video

    src_path = write_anchor_video(tmp_path / "src.mp4", 50, size=(640, 360), face_px=80)
    info, _ = open_source(src_path, 640)
    for ahead, expect_most in ((40, True), (1, False)):
        plate = tmp_path / f"plate{ahead}.mp4"
        with SourceFrames(info, ring=2, plate=plate, ahead=ahead) as src:
            frames = iter(src)
            next(frames)
            deadline, written = time.monotonic() + (30 if expect_most else 1.5), -1
            while time.monotonic() < deadline:          # the reader is busy elsewhere: no frame read
                time.sleep(0.5)
                size = plate.stat().st_size if plate.is_file() else 0
                if expect_most and size == written > 0:     # ffmpeg stopped: the queue is full
                    break
                written = size
            assert src.count == 1
            assert sum(1 for _ in frames) == 49
            src.finish()
        share = written / plate.stat().st_size
        assert (share > 0.4) == expect_most, (ahead, share)
        assert _count_frames(plate) == 50


def test_without_plate_and_image_refused(anchor_video, tmp_path):
    info, _ = open_source(anchor_video, 1920)
    with SourceFrames(info, max_frames=3) as src:
        assert sum(1 for _ in src) == 3
        src.finish()
    info.is_image = True
    with pytest.raises(ValueError, match="image"):
        SourceFrames(info)


@pytest.mark.slow
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


@pytest.mark.parametrize("tags", [[], ["-colorspace", "bt709"], ["-pix_fmt", "yuvj420p", "-colorspace", "bt470bg"]],
                         ids=["untagged", "bt709", "full-range"])
def test_rgb_matches_ffmpeg_and_the_plate_for_each_colour_matrix(tmp_path, tags):
    """Frames turned to RGB here agree with ffmpeg's own RGB decode of the source and of the plate:
    the source's colour matrix is followed (a BT.601 reading of a BT.709 source is off by up to ~20 levels)."""
    from synthetic import write_anchor_video

    base = write_anchor_video(tmp_path / "base.mp4", 3, size=(640, 360), face_px=120)
    src_path = tmp_path / "tagged.mp4"
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(base), "-c:v", "libx264", "-crf", "12",
                    *(tags or ["-pix_fmt", "yuv420p"]), str(src_path)], check=True)
    info, _ = open_source(src_path, 640)
    assert info.colorspace == (tags[-1] if tags else None)
    plate = tmp_path / "plate.mp4"
    with SourceFrames(info, plate=plate) as src:
        ours = [f.rgb() for f in src]
        src.finish()
    ref = _reference_frames(src_path, info.size)
    assert len(ours) == len(ref) == 3
    for a, b in zip(ours, ref):
        diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
        assert diff.mean() < 0.9 and diff.max() <= 4, (diff.mean(), diff.max())   # wrong matrix: mean 1.3
    with PlateReader(plate, 3) as reader:
        for k in range(3):
            assert _psnr(reader.frame(k), ours[k]) > 40.0


@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_images_are_read_upright_by_their_exif_orientation(tmp_path, fmt, orientation):
    from PIL import Image, ImageOps

    rng = np.random.default_rng(orientation)
    stored = np.kron(rng.integers(0, 256, (6, 10, 3)), np.ones((8, 8, 1))).astype(np.uint8)  # 48x80 blocks
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"o{orientation}.{fmt}"
    Image.fromarray(stored).save(path, exif=exif.tobytes(), **({} if fmt == "png" else {"quality": 100}))
    info, img = open_source(path, 1920)
    with Image.open(path) as im:
        expected = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert info.is_image and img.shape == expected.shape
    assert img.shape[:2] == ((48, 80) if orientation < 5 else (80, 48))
    assert info.size == (img.shape[1], img.shape[0])
    assert np.abs(img.astype(np.int16) - expected).mean() < 3     # lossy formats decode a little differently


def test_16_bit_images_use_the_fixed_scale_not_their_own_maximum(tmp_path):
    ramp = (np.arange(64 * 64).reshape(64, 64) * 7).astype(np.uint16)      # max 28665, far below 65535
    path = tmp_path / "deep.png"
    cv2.imwrite(str(path), np.dstack([ramp, ramp // 2, ramp // 3]))
    _, img = open_source(path, 1920)
    assert img.dtype == np.uint8
    expected = np.dstack([ramp // 3, ramp // 2, ramp]) / 256.0          # RGB, 16 -> 8 bits
    assert np.abs(img - expected).max() <= 1
    assert img.max() <= 112                                             # not stretched to 255


def test_a_stream_stating_no_usable_rate_is_kept_at_25():
    from ditto_fast.avatar.source import stream_rate

    for line in ("Stream #0:0: Video: h264, yuv420p, 640x360, 0 fps", "Stream #0:0: Video: h264, yuv420p, 640x360"):
        rate, note = stream_rate(line)
        assert rate == 25 and "no frame rate" in note
