"""YuvFrame: RGB by region from an I420 buffer, as ffmpeg converts it; crops read only the region they cover."""

from __future__ import annotations

import subprocess

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.face.crop import params_to_matrix, warp_crop
from ditto_fast.media.yuv import YuvFrame, frame_region, matrix_for_tag


def _random_i420(w: int, h: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    buf = np.empty((h * 3 // 2, w), np.uint8)
    buf[:h] = rng.integers(16, 236, (h, w))
    buf[h:] = rng.integers(16, 241, (h // 2, w))
    return buf


def _ffmpeg_rgb(buf: np.ndarray, w: int, h: int, colorspace: str) -> np.ndarray:
    """ffmpeg's own yuv420p -> rgb24 conversion of one frame tagged with `colorspace`."""
    out = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "rawvideo", "-pix_fmt", "yuv420p",
                          "-s", f"{w}x{h}", "-colorspace", colorspace, "-i", "-", "-f", "rawvideo",
                          "-pix_fmt", "rgb24", "-"], input=buf.tobytes(), capture_output=True, check=True).stdout
    return np.frombuffer(out, np.uint8).reshape(h, w, 3)


@pytest.mark.parametrize("tag", ["smpte170m", "bt709"])
def test_conversion_matches_ffmpeg(tag):
    w, h = 96, 64
    buf = _random_i420(w, h)
    ours = YuvFrame(buf, w, h, matrix_for_tag(tag)).rgb().astype(np.int16)
    diff = np.abs(ours - _ffmpeg_rgb(buf, w, h, tag))
    assert diff.max() <= 3 and diff.mean() < 0.8, (diff.max(), diff.mean())


def test_grey_levels_and_tags():
    buf = np.full((3, 4), 128, np.uint8)
    buf[:2] = [[16, 16, 235, 235], [16, 16, 235, 235]]
    rgb = YuvFrame(buf, 4, 2).rgb()
    assert rgb[:, :2].tolist() == [[[0, 0, 0]] * 2] * 2 and rgb[:, 2:].tolist() == [[[255, 255, 255]] * 2] * 2
    assert matrix_for_tag(None) == matrix_for_tag("bt470bg") == matrix_for_tag("gbr") == "bt601"
    assert matrix_for_tag("bt709") == "bt709" and matrix_for_tag("bt2020nc") == "bt2020"


def test_region_is_the_slice_of_the_whole_frame():
    w, h = 64, 48
    f = YuvFrame(_random_i420(w, h, 1), w, h, "bt709")
    full = f.rgb()
    for x0, y0, x1, y1 in ((0, 0, w, h), (3, 5, 20, 31), (1, 1, 2, 2), (10, 10, 10, 30), (63, 47, 64, 48)):
        np.testing.assert_array_equal(frame_region(f, x0, y0, x1, y1), full[y0:y1, x0:x1])
    np.testing.assert_array_equal(frame_region(full, 3, 5, 20, 31), full[5:31, 3:20])
    with pytest.raises(ValueError, match="outside"):
        f.region(-1, 0, 4, 4)
    with pytest.raises(ValueError, match="I420"):
        YuvFrame(np.zeros((48, 64), np.uint8), 64, 48)


@pytest.mark.parametrize("params", [
    (320.0, 240.0, 200.0, 0.1),       # inside the frame
    (30.0, 400.0, 300.0, -0.3),       # hanging over the left and bottom edges
    (-900.0, -900.0, 100.0, 0.0),     # entirely outside: black
    (320.3, 240.7, 60.0, 0.2),        # zoomed in (crop side < dsize): needs the bilinear margin
    (620.0, 10.0, 200.0, 0.4),        # over the right and top edges
])
def test_warp_crop_of_a_region_equals_the_whole_frame_warp(params):
    w, h = 640, 480
    f = YuvFrame(_random_i420(w, h, 2), w, h)
    M = params_to_matrix(np.array(params), 128)
    full = f.rgb()
    np.testing.assert_array_equal(warp_crop(f, M, 128), warp_crop(full, M, 128))
    # the whole-frame warp, without the region shortcut
    import cv2
    ref = cv2.warpAffine(full, M[:2], (128, 128), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                         borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    got = warp_crop(full, M, 128)
    if int(cv2.__version__.split(".")[0]) < 5:
        np.testing.assert_array_equal(got, ref)
    else:   # OpenCV 5 rounds the bilinear weights from the absolute coordinates: a shifted region differs by 1
        diff = np.abs(got.astype(np.int16) - ref)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.005, (diff.max(), (diff > 0).mean())
