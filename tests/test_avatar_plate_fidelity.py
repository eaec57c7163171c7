"""The plate keeps what the source has: 4:2:2 chroma and 10 bits (ProRes, XDCAM HD422, HDR masters) go through the
plate and the putback into a 4:2:2 deliverable unchanged outside the face; 8-bit 4:2:0 keeps today's plate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.avatar.plate import PlateReader, plate_encoder_args
from ditto_fast.media.ffpipe import video_stream_line
from ditto_fast.media.yuv import I420, Layout, layout_for, rgb_to_i420, rgb_to_yuv_matrix
from ditto_fast.render.putback import YuvPutback
from synthetic import patched_frames as _frames
from test_render_putback import CASES, blend_kernel, smooth_crop  # noqa: F401 - a fixture
from test_render_yuv import background

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()
FINE = ["yuv422p", "yuv420p10le", "yuv422p10le"]


def test_the_plate_layout_keeps_chroma_up_to_422_and_depth_up_to_10_bits():
    assert layout_for("yuv420p") == layout_for("yuvj420p") == layout_for("nv12") == layout_for(None) == I420
    assert layout_for("yuv422p10le").pix_fmt == "yuv422p10le"          # ProRes 422 HQ, DNxHR HQX
    assert layout_for("yuv422p").pix_fmt == "yuv422p"                  # XDCAM HD422, DNxHD
    assert layout_for("yuv420p10le").pix_fmt == layout_for("p010le").pix_fmt == "yuv420p10le"   # HDR HEVC
    assert layout_for("yuv444p12le").pix_fmt == layout_for("rgb48le").pix_fmt == "yuv422p10le"  # capped
    lay = Layout("yuv422p10le")
    frame = np.zeros(lay.shape(64, 48), lay.dtype)
    luma, chroma = lay.planes(frame)
    assert frame.shape == (96, 64) and luma.shape == (1, 48, 64) and chroma.shape == (2, 48, 32)
    assert np.shares_memory(luma, frame) and np.shares_memory(chroma, frame)
    assert "yuv420p" in plate_encoder_args() and "16" in plate_encoder_args()        # today's plate, unchanged
    assert "yuv422p10le" in plate_encoder_args(lay) and "10" in plate_encoder_args(lay)


def _planes_of(rgb: np.ndarray, layout: Layout) -> np.ndarray:
    """A limited-range BT.709 frame in `layout` from RGB (float conversion; chroma averaged as it is subsampled)."""
    h, w = rgb.shape[:2]
    yuv = cv2.transform(rgb.astype(np.float32), rgb_to_yuv_matrix("bt709") * layout.scale)
    frame = np.empty(layout.shape(w, h), layout.dtype)
    luma, chroma = layout.planes(frame)
    luma[0] = np.rint(yuv[..., 0])
    uv = cv2.resize(yuv[..., 1:], (w // 2, h // layout.chroma_rows), interpolation=cv2.INTER_AREA)
    chroma[0], chroma[1] = np.rint(uv[..., 0]), np.rint(uv[..., 1])
    return frame


@pytest.mark.parametrize("pix_fmt", FINE)
@pytest.mark.parametrize("name", ["scale_translate", "rotated", "left_top_outside", "sheared_flipped"])
def test_the_putback_blends_in_422_and_10_bit_planes_as_in_420(blend_kernel, name, pix_fmt):
    (h, w), M = CASES[name]
    rng = np.random.default_rng(5)
    bg, crop = background(rng, h, w), smooth_crop(rng)
    lay = Layout(pix_fmt)
    frame = _planes_of(bg, lay)
    before = frame.copy()
    kernel = YuvPutback(layout=lay)(frame.copy(), crop, M)
    numpy = YuvPutback(layout=lay, use_kernel=False)(frame.copy(), crop, M)
    assert kernel.dtype == lay.dtype and np.abs(kernel.astype(int) - numpy).max() <= lay.scale
    # the same picture as today's 8-bit 4:2:0 paste: luma to within the 8-bit rounding
    i420 = YuvPutback()(rgb_to_i420(bg), crop, M)
    diff = np.abs(lay.planes(kernel)[0].astype(np.float64) / lay.scale - I420.planes(i420)[0])
    assert diff.mean() < 0.6 and diff.max() <= 2, (diff.mean(), diff.max())
    # only the box changes; everything else keeps its codes
    x0, y0, x1, y1 = YuvPutback(layout=lay).box(M, (h, w))
    (ly, lc), (by, bc) = lay.planes(kernel), lay.planes(before)
    keep = np.ones((h, w), bool)
    keep[y0:y1, x0:x1] = False
    assert np.array_equal(ly[0][keep], by[0][keep])
    rows = lay.chroma_rows
    keep_c = np.ones((h // rows, w // 2), bool)
    keep_c[y0 // rows:y1 // rows, x0 // 2:x1 // 2] = False
    assert np.array_equal(lc[:, keep_c], bc[:, keep_c])
    assert not np.array_equal(ly, by)


def _lower_third(frames: list[np.ndarray]) -> list[np.ndarray]:
    """Station graphics on the frames: a band of 1-pixel red and blue lines (what 4:2:0 halves vertically)."""
    out = []
    for f in frames:
        f = f.copy()
        h = f.shape[0]
        band = f[h - h // 10:h - h // 30, f.shape[1] // 4:f.shape[1] * 3 // 4]
        band[0::2] = (200, 20, 20)
        band[1::2] = (20, 20, 200)
        out.append(f)
    return out


def _decode_planes(path: Path, layout: Layout, size: tuple[int, int]) -> np.ndarray:
    raw = subprocess.run([FFMPEG, "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", layout.pix_fmt,
                          "pipe:1"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, layout.dtype).reshape(-1, *layout.shape(*size))


@pytest.mark.slow
def test_a_10_bit_422_prores_source_gives_10_bit_422_prores_outside_the_face(tmp_path, tiny_checkpoints, clips):
    size = (1280, 720)
    frames = _lower_third(_frames(size, 8))
    src = tmp_path / "master.mov"
    w, h = size
    subprocess.run([FFMPEG, "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", "25",
                    "-i", "pipe:0", "-vf", "scale=out_color_matrix=bt709:out_range=tv,format=yuv422p10le",
                    "-c:v", "prores_ks", "-profile:v", "3", "-colorspace", "bt709", "-color_primaries", "bt709",
                    "-color_trc", "bt709", str(src)], input=b"".join(f.tobytes() for f in frames), check=True)
    env = dict(os.environ, DITTO_FAST_HOME=str(tmp_path / "home"), DITTO_FAST_CHECKPOINTS=str(tiny_checkpoints))
    cli = [sys.executable, "-m", "ditto_fast.cli"]
    reg = subprocess.run([*cli, "register", str(src), "--name", "master", "--quiet"], capture_output=True, text=True,
                         env=env)
    assert reg.returncode == 0, reg.stderr
    plate = next((tmp_path / "home").rglob("plate.mp4"))
    assert "yuv422p10le" in video_stream_line(plate)
    out = tmp_path / "out.mov"
    r = subprocess.run([*cli, "render", "--avatar", "master", "--audio", str(clips[0]), "-o", str(out),
                        "--codec", "prores", "--quiet"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    lay = Layout("yuv422p10le")
    got, want = _decode_planes(out, lay, size)[:4], _decode_planes(src, lay, size)[:4]
    # outside the face: the set's 10-bit codes (today's 8-bit 4:2:0 plate made every luma code a multiple of 4)
    away = np.s_[:, : h // 3, : w // 5]                  # top-left corner of the set, far from the face
    luma_got, luma_want = got[:, :h], want[:, :h]
    assert np.mean(luma_got[away] % 4 != 0) > 0.5
    assert np.abs(luma_got[away].astype(int) - luma_want[away]).mean() < 2.0      # ProRes HQ twice, 10-bit codes
    # the lower third's 1-pixel colour lines keep their own chroma rows (4:2:0 averaged each pair to purple)
    v_got, v_want = (np.stack([lay.planes(f)[1][1] for f in x]) for x in (got, want))     # V, [N, H, W/2]
    rows = np.s_[:, h - h // 10 + 2:h - h // 30 - 2, w // 8 + 4:w * 3 // 8 - 4]
    step_got = np.abs(np.diff(v_got[rows].astype(int), axis=1)).mean()
    step_want = np.abs(np.diff(v_want[rows].astype(int), axis=1)).mean()
    assert step_got > 0.8 * step_want, (step_got, step_want)
    # the default H.264 render of the same avatar is made from those planes too (8-bit 4:2:0, as MP4 carries)
    mp4 = tmp_path / "out.mp4"
    r = subprocess.run([*cli, "render", "--avatar", "master", "--audio", str(clips[0]), "-o", str(mp4), "--quiet"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "yuv420p(" in video_stream_line(mp4)
    with PlateReader(plate, 8, pix_fmt="planes") as reader:
        assert reader.layout == lay and reader.frame(0).dtype == np.uint16
