"""Background plate: mirror-loop order, block decoding with exact seeks and decoding ahead, image plates,
write_plate."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.avatar.plate import PlateReader, seek_time, write_plate_image
from ditto_fast.media.timeline import mirror_index
from ditto_fast.core.errors import AvatarError
from ditto_fast.encoding.writer import VideoWriter
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


def test_seek_time_is_the_frames_own_time():
    assert seek_time(25, Fraction(25)) == "1.000000"
    assert seek_time(50, Fraction(30000, 1001)) == "1.668333"      # 50 * 1001 / 30000 = 1.6683333...
    assert seek_time(3, Fraction(24000, 1001)) == "0.125125"
    assert seek_time(0, Fraction(50)) == "0.000000"


@pytest.mark.parametrize("fps", ["30000/1001", "24000/1001", "50", "60000/1001"])
def test_every_block_seeks_to_its_own_first_frame(tmp_path, fps):
    """Seeks at a block's exact time land on that frame at broadcast rates whose frame times are not whole
    microseconds; the keyframes of registration's plates (every 25) and blocks that start between them (7)."""
    path = tmp_path / "plate.mp4"
    assert write_plate((coded_frame(k) for k in range(75)), path, fps=fps) == 75
    for block in (25, 7):
        with PlateReader(path, 75, block_frames=block) as reader:
            for start in range(block, 75, block):       # each block opened on its own, out of order
                assert decode_index(reader.frame(start)) == start
                assert decode_index(reader.frame(start - 1)) == start - 1


@pytest.mark.parametrize("block_frames", [25, 7])
def test_decoding_ahead_in_the_given_order(plate60, block_frames):
    """Given the order, the next block of it is already decoding while one is served; the frames are the
    same as without the order, and a frame asked for out of the order is still right."""
    order = [mirror_index(i, 60) for i in range(150)]
    with PlateReader(plate60, 60, block_frames=block_frames, order=order) as reader:
        first = reader._next
        assert first is not None and first.start == 0                # the first block starts at once
        got = []
        for i, k in enumerate(order):
            got.append(decode_index(reader.frame(k)))
            if i == 0:
                assert reader._current is first                      # it was the block decoded ahead
                assert reader._next is not None and reader._next.start == block_frames
                assert reader._next._pipe._proc.wait(timeout=30) == 0   # ffmpeg finishes it unasked
        assert decode_index(reader.frame(33)) == 33                  # out of the order
        assert reader._next is None or reader._next.start != 33 - 33 % block_frames
    assert got == order
    with PlateReader(plate60, 60, block_frames=block_frames) as plain:
        assert [decode_index(plain.frame(k)) for k in order[:70]] == order[:70]


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
    # decoded ahead, the short block fails only when its frames are asked for
    with PlateReader(plate60, 70, block_frames=25, order=range(70)) as reader:
        assert [decode_index(reader.frame(k)) for k in range(50)] == list(range(50))
        with pytest.raises(AvatarError, match="expects 70"):
            reader.frame(50)


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


def test_file_size_limit_is_named(plate60, tmp_path):
    """Blocks are decoded into memory files, which a file-size limit (ulimit -f) also caps: the error says so."""
    code = ("import resource, signal; from ditto_fast.avatar.plate import PlateReader\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000)); signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"PlateReader({str(plate60)!r}, 60).frame(0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0 and "file-size limit" in r.stderr and "ulimit -f" in r.stderr, r.stderr
