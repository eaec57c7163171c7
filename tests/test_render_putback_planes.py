"""The yuv420p render path: plate bytes in, face box blended per plane, the same bytes out around it."""

from __future__ import annotations

import subprocess

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.engine.request import RenderRequest
from ditto_fast.avatar.plate import PlateReader
from ditto_fast.render import putback as putback_mod
from ditto_fast.render.putback import YuvPutback
from ditto_fast.encoding.writer import VideoWriter
from ditto_fast.media.yuv import YuvFrame, i420_planes, rgb_to_i420
from support import CASES, background, reference_putback, smooth_crop


def decode_i420(path, w: int, h: int) -> np.ndarray:
    """Every frame of a video as ffmpeg decodes it to yuv420p, untouched: [N, H * 3 / 2, W] uint8."""
    raw = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-f", "rawvideo",
                          "-pix_fmt", "yuv420p", "pipe:1"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, h * 3 // 2, w)


def outside(box: tuple[int, int, int, int], h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks of the luma [h, w] and chroma [h/2, w/2] samples outside an even box."""
    x0, y0, x1, y1 = box
    luma = np.ones((h, w), bool)
    luma[y0:y1, x0:x1] = False
    chroma = np.ones((h // 2, w // 2), bool)
    chroma[y0 // 2:y1 // 2, x0 // 2:x1 // 2] = False
    return luma, chroma


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "numpy"])
@pytest.mark.parametrize("name", list(CASES))
def test_yuv_paste_matches_the_float_reference_and_keeps_the_rest(blend_kernel, name, use_kernel):
    (h, w), M = CASES[name]
    rng = np.random.default_rng(3)
    bg_rgb, crop = background(rng, h, w), smooth_crop(rng)
    frame = rgb_to_i420(bg_rgb)
    before = frame.copy()
    out = YuvPutback(use_kernel=use_kernel)(frame, crop, M)
    assert out is frame
    # against a full-frame float RGB paste, converted afterwards: the same picture, within the chroma's
    # half resolution
    want = rgb_to_i420(reference_putback(bg_rgb, crop, M))
    diff = np.abs(out.astype(int) - want)
    assert diff.mean() < 0.6, diff.mean()
    assert np.percentile(diff, 99.5) <= 6
    # nothing outside the box changed, to the byte
    box = YuvPutback().box(M, (h, w))
    ly, lc = outside(box, h, w)
    (y0, c0), (y1, c1) = i420_planes(before), i420_planes(out)
    assert np.array_equal(y0[0][ly], y1[0][ly])
    assert np.array_equal(c0[:, lc], c1[:, lc])
    assert not np.array_equal(before, out)


def test_kernel_and_numpy_agree(blend_kernel):
    (h, w), M = CASES["rotated"]
    rng = np.random.default_rng(8)
    frame, crop = rgb_to_i420(background(rng, h, w)), smooth_crop(rng)
    a = YuvPutback()(frame.copy(), crop, M)
    b = YuvPutback(use_kernel=False)(frame.copy(), crop, M)
    assert YuvPutback().use_kernel and not YuvPutback(use_kernel=False).use_kernel
    d = np.abs(a.astype(int) - b)
    assert d.max() <= 2 and (d > 0).mean() < 0.01


def test_off_frame_crop_and_bad_frames():
    frame = np.full((96, 64), 77, np.uint8)
    crop = np.zeros((512, 512, 3), np.uint8)
    far = np.array([[0.1, 0, 5000.0], [0, 0.1, 5000.0], [0, 0, 1.0]])
    assert np.array_equal(YuvPutback()(frame, crop, far), np.full((96, 64), 77, np.uint8))
    with pytest.raises(ValueError, match="yuv420p"):
        YuvPutback()(np.zeros((64, 64, 3), np.uint8), crop, np.eye(3))
    with pytest.raises(ValueError, match="crop"):
        YuvPutback()(frame, np.zeros((256, 256, 3), np.uint8), np.eye(3))


def test_rgb_to_i420_inverts_yuvframe():
    rng = np.random.default_rng(0)
    rgb = background(rng, 64, 96)
    back = YuvFrame(rgb_to_i420(rgb), 96, 64, matrix="bt709").region(0, 0, 96, 64)
    assert np.abs(back.astype(int) - rgb).mean() < 2.5


def test_writer_passes_yuv420p_through_unchanged(tmp_path):
    rng = np.random.default_rng(1)
    frames = [rgb_to_i420(background(rng, 48, 64)) for _ in range(4)]
    out = tmp_path / "lossless.mp4"
    with VideoWriter(out, (64, 48), crf=0, preset="ultrafast", pix_fmt="yuv420p") as vw:
        for f in frames:
            vw.write(f)
    got = decode_i420(out, 64, 48)
    assert got.shape[0] == 4 and np.array_equal(got, np.stack(frames))
    with pytest.raises(ValueError, match="uint8"):
        with VideoWriter(tmp_path / "x.mp4", (64, 48), pix_fmt="yuv420p") as vw:
            vw.write(np.zeros((48, 64, 3), np.uint8))
    assert not (tmp_path / "x.mp4").exists()


def test_plate_reader_yuv_is_the_plate_bytes_or_rematrixed(tmp_path):
    from synthetic import write_anchor_video

    for bt709 in (True, False):
        src = write_anchor_video(tmp_path / f"a{int(bt709)}.mp4", 6, size=(160, 96), face_px=60, bt709=bt709)
        raw = decode_i420(src, 160, 96)
        with PlateReader(src, 6, pix_fmt="yuv420p") as yuv, PlateReader(src, 6) as rgb:
            assert yuv.matrix == ("bt709" if bt709 else "bt601")
            for k in (0, 5, 2):
                frame = yuv.frame(k)
                assert frame.shape == (144, 160)
                if bt709:                                  # the plate's own bytes
                    assert np.array_equal(frame, raw[k])
                else:                                      # BT.601 re-matrixed to BT.709 by ffmpeg
                    assert not np.array_equal(frame, raw[k])
                    assert np.abs(frame.astype(int) - rgb_to_i420(rgb.frame(k))).mean() < 1.5


@pytest.mark.register
def test_render_keeps_the_plate_outside_the_face_box(tmp_path, tiny_checkpoints, ditto_home, clips, monkeypatch):
    """An HD (BT.709) anchor: every byte the encoder gets outside the face box is the plate's."""
    from synthetic import Motion, write_anchor_video

    from ditto_fast.avatar.register import register_avatar
    from ditto_fast.engine.renderer import Renderer

    src = write_anchor_video(tmp_path / "hd.mp4", 8, size=(1280, 720), face_px=120, bt709=True,
                             motion=Motion(center=(640.0, 370.0), velocity=(0.5, 0.0), spin_deg=0.0))
    register_avatar(src, name="hd", checkpoints=tiny_checkpoints, device="cpu")
    written = []
    real_write = VideoWriter.write
    monkeypatch.setattr(VideoWriter, "write", lambda self, f: (written.append(f.copy()), real_write(self, f)))
    engine = Renderer(tiny_checkpoints, device="cpu")
    avatar = engine.avatar("hd")
    engine.render(RenderRequest("hd", clips[0], tmp_path / "out.mp4"))
    plate = decode_i420(avatar.plate_path, 1280, 720)
    assert len(written) == 10
    box_of = YuvPutback().box
    changed = 0
    for i, f in enumerate(written):
        k = min(i, 7) if i < 8 else 15 - i                  # the mirror loop over 8 plate frames
        ly, lc = outside(box_of(avatar.M_c2o[k], (720, 1280)), 720, 1280)
        (py, pc), (fy, fc) = i420_planes(plate[k]), i420_planes(f)
        assert np.array_equal(py[0][ly], fy[0][ly]) and np.array_equal(pc[:, lc], fc[:, lc]), i
        changed += int(not np.array_equal(plate[k], f))
    assert changed == len(written)                         # and the face was pasted into each
    got = decode_i420(tmp_path / "out.mp4", 1280, 720)
    assert got.shape[0] == 10


def test_numpy_fallback_is_used_without_the_kernel_and_warns_once(monkeypatch):
    import warnings

    monkeypatch.setattr(putback_mod, "_blend", None)
    monkeypatch.setattr(putback_mod, "_warned_fallback", False)
    with pytest.warns(RuntimeWarning, match="not built"):
        assert not YuvPutback().use_kernel
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not YuvPutback().use_kernel           # no second warning
    assert not YuvPutback(use_kernel=False).use_kernel
