"""Delivery: the anchor's own frame rate, other output rates by motion blended in time, containers and codecs
that match the name, colour tags, and file modes from the umask."""

from __future__ import annotations

import os
import re
import subprocess
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
import soundfile as sf

from ditto_fast.engine.request import RenderRequest
from ditto_fast.core.errors import UsageError
from ditto_fast.media.rates import frames_for, from_stream, parse_frame_rate, rate_text
from ditto_fast.media.timeline import motion_timeline, source_indices
from ditto_fast.encoding.formats import output_format
from ditto_fast.encoding.writer import VideoWriter
from synthetic import Motion

NTSC = Fraction(30000, 1001)
SMALL_MOTION = Motion.for_face(100, center=(330.0, 300.0), velocity=(0.5, 0.0), spin_deg=0.05)   # in 640x480


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def describe(path: Path) -> str:
    """What `ffmpeg -i` says of a file."""
    res = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path)],
                         capture_output=True, text=True)
    return res.stderr


def stream_rate(path: Path) -> Fraction:
    """The video stream's exact frame rate: the time base ffmpeg gives decoded frames is 1 / rate."""
    out = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-v", "error", "-i", str(path),
                          "-map", "0:v:0", "-frames:v", "2", "-f", "framemd5", "-"], capture_output=True,
                         text=True).stdout
    tb = re.search(r"#tb 0: (\d+)/(\d+)", out)
    return Fraction(int(tb.group(2)), int(tb.group(1)))


def decode_gray(path: Path) -> np.ndarray:
    """Every frame's luma as [N, H, W] uint8."""
    size = re.search(r", (\d+)x(\d+)", re.search(r"Stream #.*Video:.*", describe(path)).group(0))
    w, h = int(size.group(1)), int(size.group(2))
    raw = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path), "-map", "0:v:0",
                          "-f", "rawvideo", "-pix_fmt", "gray", "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, h, w)


# ----------------------------------------------------------------------------- rates and timing
def test_rates_parse_the_broadcast_rates_exactly():
    assert parse_frame_rate("29.97") == parse_frame_rate("30000/1001") == NTSC
    assert parse_frame_rate("23.976") == Fraction(24000, 1001) and parse_frame_rate("59.94") == Fraction(60000, 1001)
    assert [parse_frame_rate(r) for r in ("24", "25", "30", "50", "60")] == [24, 25, 30, 50, 60]
    for bad in ("23", "30.5", "abc", "0", "1/0", "-25"):
        with pytest.raises(ValueError, match="not one of"):
            parse_frame_rate(bad)
    assert rate_text(NTSC) == "30000/1001" and rate_text(Fraction(25)) == "25"
    assert from_stream(29.97) == NTSC and from_stream(25.0) == 25 and from_stream(12.5) == Fraction(25, 2)


def test_frame_counts_cover_the_audio_at_any_rate():
    assert frames_for(16000, Fraction(25)) == 25 and frames_for(16001, Fraction(25)) == 26
    assert frames_for(640 * 7, Fraction(25)) == 7                      # as Ditto's ceil(n / 640)
    ten_minutes = 16000 * 600
    assert frames_for(ten_minutes, NTSC) == 17983                       # ceil(600 * 29.97002997)
    assert frames_for(ten_minutes, Fraction(30)) == 18000


@pytest.mark.parametrize("rate", [Fraction(25), NTSC, Fraction(60000, 1001), Fraction(24000, 1001), Fraction(50)])
def test_a_click_lands_on_the_frame_of_its_time_after_ten_minutes(rate):
    """Motion that steps at the 25 fps frame of a click 9 min 47.3 s into a 10 minute clip reaches the output
    at the frame whose time is the click's (to within one output frame): no drift at any rate."""
    n_motion = frames_for(16000 * 600, Fraction(25))
    n_out = frames_for(16000 * 600, rate)
    click = Fraction(5873, 10)                                          # seconds
    j_click = int(click * 25)
    step = (np.arange(n_motion) >= j_click).astype(np.float64)
    j0, j1, w = motion_timeline(n_out, rate, n_motion)
    value = step[j0] * (1 - w) + step[j1] * w
    first = int(np.argmax(value >= 1))                                  # first output frame fully moved
    assert 0 <= Fraction(first) / rate - Fraction(j_click, 25) < 1 / rate   # the first at or after its time
    assert abs(Fraction(first) / rate - click) <= 1 / rate
    assert ((value > 0) & (value < 1)).sum() <= 3                         # a ramp of at most one motion frame
    if rate == 25:
        assert first == j_click and (w == 0).all() and (j0 == np.arange(n_out)).all()


def test_source_frames_follow_time_and_stay_in_order_at_the_same_rate():
    assert (source_indices(90, Fraction(30), Fraction(30)) == np.arange(90)).all()
    assert list(source_indices(6, Fraction(25), Fraction(30))) == [0, 1, 2, 3, 4, 6]    # 30 fps source at 25
    assert list(source_indices(4, NTSC, NTSC)) == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- formats
def test_the_extension_picks_the_container_and_bad_pairs_are_refused(tmp_path):
    assert output_format(tmp_path / "a.mp4").container == "mp4"
    assert output_format(tmp_path / "a.MOV", "prores").container == "mov"
    assert output_format(tmp_path / "a.mkv", "hevc").codec == "hevc"
    with pytest.raises(UsageError, match=r"\.mp4, \.mov or \.mkv"):
        output_format(tmp_path / "a.avi")
    with pytest.raises(UsageError, match="QuickTime"):
        output_format(tmp_path / "a.mp4", "prores")
    with pytest.raises(UsageError, match="unknown codec"):
        output_format(tmp_path / "a.mp4", "vp9")


def _gradient(w: int, h: int, k: int) -> np.ndarray:
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
    return np.clip(np.broadcast_to((x + y) / 2 + 3 * k, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("name,codec,expect", [
    ("a.mov", "prores", ("Input #0, mov,mp4", "prores (HQ)", "yuv422p10le", "pcm_s24le")),
    ("a.mkv", None, ("Input #0, matroska", "h264", "yuv420p", "aac")),
    ("a.mp4", "hevc", ("Input #0, mov,mp4", "hevc", "yuv420p", "aac")),
    ("a.mov", None, ("Input #0, mov,mp4", "h264", "yuv420p", "aac")),
])
def test_writer_makes_the_named_container_and_codec_tagged_bt709_48k(tmp_path, name, codec, expect):
    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(16000, np.float32), 16000)
    out = tmp_path / name
    with umask(0o022):
        with VideoWriter(out, (64, 48), fps=NTSC, audio_path=wav, fmt=output_format(out, codec), frames=12,
                         comment="ditto-fast test digest") as vw:
            for k in range(12):
                vw.write(_gradient(64, 48, k))
    text = describe(out)
    for want in expect:
        assert want in text, (want, text)
    assert "bt709" in text and "48000 Hz" in text and "29.97 fps" in text
    assert stream_rate(out) == NTSC
    assert decode_gray(out).shape[0] == 12
    assert out.stat().st_mode & 0o777 == 0o644
    from ditto_fast.media.ffpipe import container_comment
    assert container_comment(out) == "ditto-fast test digest"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_outputs_follow_a_stricter_umask(tmp_path):
    out = tmp_path / "a.mp4"
    with umask(0o077):
        with VideoWriter(out, (64, 48)) as vw:
            vw.write(_gradient(64, 48, 0))
    assert out.stat().st_mode & 0o777 == 0o600


# ----------------------------------------------------------------------------- the source's own rate
def test_stream_rate_keeps_constant_rates_and_rounds_variable_ones():
    from ditto_fast.avatar.source import stream_rate as pick

    line = "Stream #0:0: Video: h264 (High), yuv420p(tv, bt709, progressive), 1920x1080, 2000 kb/s, {} fps, {} tbr"
    assert pick(line.format("29.97", "29.97")) == (NTSC, None)
    assert pick(line.format("30", "30")) == (Fraction(30), None)
    assert pick(line.format("12.50", "12.50")) == (Fraction(25, 2), None)
    rate, note = pick(line.format("27.43", "60"))
    assert rate == NTSC and "variable frame rate" in note and "30000/1001" in note


def test_a_variable_rate_source_is_kept_at_the_nearest_standard_rate_and_said(tmp_path):
    """28 frames a second with a 0.3 s gap (average 24.66 fps): kept at 25 fps, with a note saying so."""
    from ditto_fast.avatar.source import open_source

    src = tmp_path / "vfr.mp4"
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i",
                    "testsrc=size=320x240:rate=30:duration=2", "-vf",
                    "settb=1/1000,setpts='(N/28+if(gt(N,30),0.3,0))/TB'", "-fps_mode", "vfr",
                    "-c:v", "libx264", str(src)], check=True)
    info, _ = open_source(src, 1920)
    assert info.rate == 25 and info.rate_note and "variable frame rate" in info.rate_note


def _marked_anchor(path: Path, n: int, fps: int) -> Path:
    """A 640x480 anchor video at `fps` whose top-left 32x32 block has grey level 16 * (frame number + 1)."""
    from synthetic import astronaut_canvas

    size = (640, 480)
    writer = imageio_ffmpeg.write_frames(str(path), size, fps=fps, codec="libx264", pix_fmt_out="yuv420p",
                                         quality=None, output_params=["-crf", "12"], macro_block_size=2)
    writer.send(None)
    for i in range(n):
        frame = astronaut_canvas(i, SMALL_MOTION, size)
        frame[:32, :32] = 16 * (i + 1)
        writer.send(frame)
    writer.close()
    return path


def _markers(path: Path) -> list[int]:
    """The frame number each output frame's marker block shows."""
    return [int(round(float(f[8:24, 8:24].mean()) / 16)) - 1 for f in decode_gray(path)]


@pytest.fixture(scope="module")
def anchor_30(tmp_path_factory, tiny_checkpoints, session_home):
    from ditto_fast.avatar.register import Registrar

    src = _marked_anchor(tmp_path_factory.mktemp("a30") / "anchor30.mp4", 12, 30)
    Registrar(tiny_checkpoints, "cpu").register(src, "anchor30", force=True)
    from ditto_fast.avatar import load_avatar
    return load_avatar("anchor30")


@pytest.fixture(scope="module")
def half_second(tmp_path_factory, speech_wav) -> Path:
    audio, sr = sf.read(speech_wav, dtype="float32")
    p = tmp_path_factory.mktemp("half") / "half.wav"
    sf.write(p, audio[sr:sr + sr // 2], sr)
    return p


@pytest.mark.register
@pytest.mark.slow
def test_registration_keeps_a_30fps_anchor_at_30fps(anchor_30):
    assert anchor_30.rate == 30 and anchor_30.fps == 30.0 and anchor_30.n_frames == 12
    assert _markers(anchor_30.plate_path) == list(range(12))


@pytest.mark.register
@pytest.mark.slow
def test_a_30fps_anchor_renders_at_30fps_with_every_background_frame_in_order(anchor_30, half_second, tmp_path,
                                                                              engine):
    out = engine.render(RenderRequest("anchor30", half_second, tmp_path / "native.mp4")).output
    assert stream_rate(out) == 30
    marks = _markers(out)
    assert len(marks) == 15                                             # ceil(0.5 s * 30)
    assert marks == [*range(12), 11, 10, 9]                             # the source's frames, mirror-looped
    assert re.search(r"Duration: 00:00:00\.5\d", describe(out))


@pytest.mark.register
@pytest.mark.slow
@pytest.mark.parametrize("fps,frames,rate,name", [("25", 13, Fraction(25), "r.mkv"), ("30000/1001", 15, NTSC, "r.mp4"),
                                                  ("59.94", 30, Fraction(60000, 1001), "r.mov")])
def test_other_rates_give_their_frame_counts_and_background_in_time(anchor_30, half_second, tmp_path, engine,
                                                                    fps, frames, rate, name):
    out = engine.render(RenderRequest("anchor30", half_second, tmp_path / name, fps=fps)).output
    # Matroska keeps times in milliseconds, so only MP4/QuickTime hold an NTSC rate exactly
    assert stream_rate(out) == rate
    marks = _markers(out)
    assert len(marks) == frames
    want = [min(k, 23 - k) for k in source_indices(frames, rate, Fraction(30))]   # time-mapped, mirror-looped
    assert marks == want


def test_render_refuses_unsupported_names_codecs_and_rates(run_cli, video_avatar, half_second, tmp_path,
                                                          tiny_checkpoints, session_home):
    from conftest import store_env

    env = store_env(session_home, tiny_checkpoints)
    base = ["render", "--avatar", "anchor", "--audio", half_second, "--device", "cpu"]
    for extra, words in ((["-o", tmp_path / "x.avi"], ".mp4, .mov or .mkv"),
                         (["-o", tmp_path / "x.mp4", "--codec", "prores"], "name the output .mov"),
                         (["-o", tmp_path / "x.mp4", "--fps", "23"], "not one of")):
        res = run_cli([*base, *extra], env=env)
        assert res.returncode == 2 and words in res.stderr, res.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.register
def test_avatar_files_follow_the_umask(tmp_path, tiny_checkpoints, monkeypatch):
    from ditto_fast.avatar.register import Registrar
    from synthetic import astronaut_canvas

    import cv2

    monkeypatch.setenv("DITTO_FAST_HOME", str(tmp_path / "home"))
    img = tmp_path / "face.png"
    cv2.imwrite(str(img), astronaut_canvas(0, SMALL_MOTION, size=(640, 480))[..., ::-1])
    with umask(0o022):
        d = Registrar(tiny_checkpoints, "cpu").register(img, "still")
    assert d.stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in d.iterdir()} == {0o644}


def test_encoders_software_by_default_on_cpu_and_nvenc_refused_where_it_does_not_work(tiny_checkpoints):
    from ditto_fast.encoding.formats import Format, nvenc_works
    from ditto_fast.engine.options import EngineOptions
    from ditto_fast.engine.render_setup import RenderSetup

    def resolve(**options):
        return RenderSetup.resolve(EngineOptions(device="cpu", checkpoints=tiny_checkpoints, **options))

    assert resolve().nvenc is False                  # auto on a CPU
    assert resolve(encoder="software").nvenc is False
    assert Format("mp4", "hevc", nvenc=True).encoder == "hevc_nvenc"
    assert "-cq" in Format("mp4", "h264", nvenc=True).video_args(18, "veryfast")
    assert Format("mov", "prores", nvenc=True).encoder == "prores_aw"
    works, why = nvenc_works("h264")
    if works:
        assert resolve(encoder="nvenc").nvenc is True
    else:
        assert why                                            # ffmpeg's reason, e.g. no libcuda
        with pytest.raises(UsageError, match="NVENC does not work on this machine"):
            resolve(encoder="nvenc")
    with pytest.raises(UsageError, match="encoder must be one of auto, software, nvenc, got 'x264'"):
        resolve(encoder="x264")                               # refused when the options are made


def test_nvenc_options_crf_zero_and_a_codec_whose_nvenc_fails(tiny_checkpoints):
    import dataclasses
    from types import SimpleNamespace

    from ditto_fast.encoding.formats import Format, nvenc_works
    from ditto_fast.engine.options import EngineOptions
    from ditto_fast.engine.render_setup import RenderSetup

    lossless = Format("mp4", "h264", nvenc=True).video_args(0, "veryfast")
    assert "-cq" not in lossless and lossless[lossless.index("-tune") + 1] == "lossless"   # NVENC's cq 0 = automatic
    quality = Format("mp4", "hevc", nvenc=True).video_args(23, "veryfast")
    assert quality[quality.index("-cq") + 1] == "23" and quality[quality.index("-tune") + 1] == "hq"
    # a setup that encodes on NVENC gives a clip the software encoder when that codec's NVENC does not work
    setup = RenderSetup.resolve(EngineOptions(device="cpu", checkpoints=tiny_checkpoints))
    setup = dataclasses.replace(setup, nvenc=True)
    for codec in ("h264", "hevc"):
        clip = SimpleNamespace(format=Format("mp4", codec))
        assert setup.output_format(clip).nvenc is nvenc_works(codec)[0]
    assert setup.output_format(SimpleNamespace(format=Format("mov", "prores"))).encoder == "prores_aw"
