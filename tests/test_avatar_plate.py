"""Background plate: mirror-loop order, streamed block decoding with seeks, image plates, write_plate."""

from __future__ import annotations

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.avatar.plate import PlateReader, mirror_index, write_plate_image
from ditto_fast.errors import AvatarError
from ditto_fast.render.writer import VideoWriter
from synthetic import write_plate

W, H = 64, 48


def coded_frame(k: int) -> np.ndarray:
    """Frame whose 8 vertical stripes spell k in binary (dark = 0, light = 1), over a gradient band."""
    f = np.zeros((H, W, 3), np.uint8)
    for b in range(8):
        f[:, b * 8:(b + 1) * 8] = 235 if (k >> b) & 1 else 16
    f[40:, :, 1] = np.linspace(0, 255, W, dtype=np.uint8)[None, :]
    return f


def decode_index(f: np.ndarray) -> int:
    """Inverse of coded_frame, tolerant to H.264 loss."""
    return sum(1 << b for b in range(8) if f[4:36, b * 8 + 2:b * 8 + 6].mean() > 128)


@pytest.fixture(scope="module")
def plate60(tmp_path_factory):
    path = tmp_path_factory.mktemp("plate") / "plate.mp4"
    assert write_plate((coded_frame(k) for k in range(60)), path) == 60
    return path


def test_mirror_index_order():
    assert [mirror_index(i, 1) for i in range(5)] == [0, 0, 0, 0, 0]
    assert [mirror_index(i, 2) for i in range(9)] == [0, 1, 1, 0, 0, 1, 1, 0, 0]
    assert [mirror_index(i, 4) for i in range(17)] == [0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3, 3, 2, 1, 0, 0]
    for n in (3, 7, 25):
        seq = [mirror_index(i, n) for i in range(4 * n)]
        assert seq[:n] == list(range(n)) and seq[n:2 * n] == list(range(n - 1, -1, -1)) and seq[2 * n:] == seq[:2 * n]
    with pytest.raises(ValueError):
        mirror_index(0, 0)


def test_plate_is_high_quality_h264(plate60):
    n, _ = imageio_ffmpeg.count_frames_and_secs(str(plate60))
    assert n == 60
    with PlateReader(plate60, 60) as reader:
        for k in (0, 17, 59):
            assert np.abs(reader.frame(k).astype(int) - coded_frame(k)).mean() < 2


@pytest.mark.parametrize("block_frames", [25, 7, 60, 100])
def test_streamed_frames_follow_mirror_order(plate60, block_frames):
    n = 60
    count = 2 * n + 31                      # forward, backward, and into the second forward run
    with PlateReader(plate60, n, block_frames=block_frames) as reader:
        got = [decode_index(reader[i]) for i in range(count)]
    assert got == [mirror_index(i, n) for i in range(count)]


def test_fewer_plate_frames_than_file_and_iteration(plate60):
    n = 13                                  # the avatar may use only the first n frames
    with PlateReader(plate60, n, block_frames=5) as reader:
        got = [decode_index(f) for _, f in zip(range(3 * n), reader)]
    assert got == [mirror_index(i, n) for i in range(3 * n)]


def test_seek_without_aligned_keyframes_at_30fps(tmp_path):
    """A plate not written by write_plate (long GOP, 30 fps) still decodes every index exactly."""
    path = tmp_path / "plate30.mp4"
    with VideoWriter(path, (W, H), fps=30, crf=12) as vw:
        for k in range(40):
            vw.write(coded_frame(k))
    with PlateReader(path, 40, block_frames=6) as reader:
        got = [decode_index(reader[i]) for i in range(80)]
    assert got == [mirror_index(i, 40) for i in range(80)]


def test_frames_are_fresh_copies(plate60):
    with PlateReader(plate60, 60) as reader:
        a = reader[59]
        a[:] = 0                            # putback writes into the frame in place
        b = reader[60]                      # same plate frame (59) at the turning point
        assert decode_index(b) == 59 and b.flags.writeable


def test_short_plate_is_an_avatar_error(plate60):
    with PlateReader(plate60, 70, block_frames=25) as reader:
        reader.frame(30)
        with pytest.raises(AvatarError, match="expects 70"):
            reader.frame(65)


def test_image_plate(tmp_path):
    img = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)
    path = tmp_path / "plate.png"
    write_plate_image(img, path)
    with PlateReader(path, 1) as reader:
        frames = [reader[i] for i in range(3)]
    for f in frames:
        assert np.array_equal(f, img)
    frames[0][:] = 0
    assert np.array_equal(frames[1], img) and reader.frame(0) is not frames[1]


def test_missing_or_bad_plate(tmp_path):
    with pytest.raises(AvatarError, match="missing"):
        PlateReader(tmp_path / "plate.mp4", 10)
    (tmp_path / "plate.png").write_bytes(b"not a png")
    with pytest.raises(AvatarError, match="unreadable"):
        PlateReader(tmp_path / "plate.png", 1)
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    with pytest.raises(AvatarError, match="not a readable video"):
        PlateReader(tmp_path / "bad.mp4", 10)


def test_write_plate_aborts_on_error(tmp_path):
    def frames():
        yield coded_frame(0)
        raise RuntimeError("registration failed")

    with pytest.raises(RuntimeError):
        write_plate(frames(), tmp_path / "plate.mp4")
    assert list(tmp_path.iterdir()) == []
