"""The live stream out: two seconds of a moving pattern and a tone to a .ts file, HLS, UDP, SRT (both directions) and
RTMP, each read back by a real ffmpeg receiver; bad destinations refused at construction; a dead ffmpeg or a peer
that never answers raised as one line, never a hang."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.live.outputs import StreamOutput, check_destination, describe_destination
from ditto_fast.media.ffpipe import stream_lines
from support import at_most, free_port

SIZE, RATE, FRAMES = (160, 96), Fraction(25), 50
SAMPLES_PER_FRAME = 16000 // 25
FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()


def frame(i: int) -> np.ndarray:
    """yuv420p planes [H * 3/2, W]: a bright bar moving across a dark picture."""
    w, h = SIZE
    planes = np.full((h * 3 // 2, w), 128, np.uint8)
    planes[:h] = 40
    planes[:h, (4 * i) % (w - 16):(4 * i) % (w - 16) + 16] = 220
    return planes


def tone(i: int) -> np.ndarray:
    t = (np.arange(SAMPLES_PER_FRAME) + i * SAMPLES_PER_FRAME) / 16000
    return (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


def stream(dest: str, frames: int = FRAMES, pace: float = 0.0) -> StreamOutput:
    """Write `frames` frames and their tone to `dest` (`pace` s apart) and close."""
    out = StreamOutput(dest, SIZE, RATE, "yuv420p", preset="ultrafast")
    for i in range(frames):
        out.write(frame(i), tone(i))
        time.sleep(pace)
    out.close()
    assert out.frames_written == frames and out.samples_written == frames * SAMPLES_PER_FRAME
    return out


def receiver(args: list[str], out: Path) -> subprocess.Popen:
    """A real ffmpeg receiver copying what it gets into `out`."""
    return subprocess.Popen([FFMPEG, "-hide_banner", "-nostdin", "-loglevel", "error", "-y", *args, "-c", "copy",
                             str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def decoded(path: Path, stream_spec: str, fmt: list[str]) -> bytes:
    res = subprocess.run([FFMPEG, "-hide_banner", "-nostdin", "-loglevel", "error", "-i", str(path), "-map",
                          stream_spec, *fmt, "pipe:1"], capture_output=True, timeout=30)
    assert res.returncode == 0, res.stderr.decode()
    return res.stdout


def check_stream(path: Path, frames: int = FRAMES, lost: float = 0.0) -> None:
    """One H.264 stream at the size and rate with all `frames`, one AAC 48 kHz stereo stream as long (within a
    frame, less the encoder's 1024-sample priming); up to `lost` seconds may be missing at the end."""
    lines = stream_lines(path)
    video = [ln for ln in lines if ": Video: " in ln]
    audio = [ln for ln in lines if ": Audio: " in ln]
    assert len(video) == 1 and len(audio) == 1, lines
    assert "h264" in video[0] and "160x96" in video[0] and re.search(r"\b25 fps", video[0]), video[0]
    assert "aac" in audio[0] and "48000 Hz" in audio[0] and "stereo" in audio[0], audio[0]
    w, h = SIZE
    pictures = len(decoded(path, "0:v:0", ["-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "gray"]))
    pictures //= w * h
    seconds = len(decoded(path, "0:a:0", ["-f", "s16le", "-ac", "1", "-ar", "48000"])) / 2 / 48000 - 1024 / 48000
    assert frames - lost * RATE <= pictures <= frames, pictures
    assert -lost - 1 / RATE <= seconds - frames / RATE <= 1 / RATE, seconds


def test_a_ts_file(tmp_path):
    out = tmp_path / "live.ts"
    with at_most(15):
        stream(str(out))
    check_stream(out)
    duration = re.search(r"Duration: (\d+):(\d+):([\d.]+)", subprocess.run(
        [FFMPEG, "-hide_banner", "-i", str(out)], capture_output=True, text=True).stderr)
    assert abs(float(duration.group(3)) - 2.0) < 0.1, duration.group(0)


def test_hls_with_an_end(tmp_path):
    playlist = tmp_path / "live.m3u8"
    with at_most(15):
        stream(str(playlist))
    text = playlist.read_text()
    segments = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert text.rstrip().endswith("#EXT-X-ENDLIST") and len(segments) == 2, text
    assert all((tmp_path / s).is_file() and stream_lines(tmp_path / s) for s in segments), segments
    check_stream(playlist)


@pytest.mark.slow          # real processes on the wall clock
def test_udp_to_a_receiver_started_first(tmp_path):
    port, got = free_port(), tmp_path / "got.ts"
    with at_most(15):
        rx = receiver(["-i", f"udp://127.0.0.1:{port}?timeout=1500000"], got)
        time.sleep(0.3)
        stream(f"udp://127.0.0.1:{port}", pace=0.01)
        assert rx.wait(10) == 0, rx.stderr.read().decode()
    check_stream(got)


@pytest.mark.parametrize("we_listen", [True, False], ids=["output-listens", "receiver-listens"])
@pytest.mark.slow          # real processes on the wall clock
def test_srt_both_ways(tmp_path, we_listen):
    port, got = free_port(), tmp_path / "got.ts"
    ours, theirs = ("listener", "caller") if we_listen else ("caller", "listener")
    with at_most(15):
        if not we_listen:
            rx = receiver(["-f", "mpegts", "-i", f"srt://127.0.0.1:{port}?mode={theirs}&timeout=1000000"], got)
            time.sleep(0.3)
        sending = threading.Thread(target=stream, args=(f"srt://127.0.0.1:{port}?mode={ours}", FRAMES, 0.01),
                                   daemon=True)
        sending.start()
        if we_listen:
            time.sleep(0.3)
            rx = receiver(["-f", "mpegts", "-i", f"srt://127.0.0.1:{port}?mode={theirs}&timeout=1000000"], got)
        sending.join(10)
        assert not sending.is_alive()
        assert rx.wait(5) == 0, rx.stderr.read().decode()
    # SRT drops the last message or two sent just before the close now and then (1 to 8 TS packets: up to 3 AAC
    # frames or a picture, measured); without the output's linger it dropped half a second
    check_stream(got, lost=0.1)


def test_rtmp_to_a_listening_receiver(tmp_path):
    port, got = free_port(), tmp_path / "got.flv"
    with at_most(15):
        rx = receiver(["-listen", "1", "-i", f"rtmp://127.0.0.1:{port}/live/key"], got)
        time.sleep(0.3)
        stream(f"rtmp://127.0.0.1:{port}/live/key")
        assert rx.wait(10) == 0, rx.stderr.read().decode()
    check_stream(got)


@pytest.mark.slow          # real processes on the wall clock
def test_an_srt_caller_with_nobody_listening_fails_in_one_line():
    dest = f"srt://127.0.0.1:{free_port()}"
    out = StreamOutput(dest, SIZE, RATE, "yuv420p")
    with at_most(12), pytest.raises(InputError) as caught:      # SRT's 3 s connect timeout, then ffmpeg exits
        for i in range(10_000):
            out.write(frame(i), tone(i))
        out.close()
    message = str(caught.value)
    assert message.startswith(f"streaming to {dest} (srt) failed: ") and "\n" not in message, message
    assert not out.alive()
    out.close()
    out.abort()


@pytest.mark.slow          # real processes on the wall clock
def test_a_write_waiting_on_ffmpeg_raises_once_ffmpeg_dies(tmp_path):
    """A listener nobody calls takes nothing, so writes soon wait; killing ffmpeg ends the wait with the error."""
    out = StreamOutput(f"srt://127.0.0.1:{free_port()}?mode=listener", SIZE, RATE, "yuv420p")
    killer = threading.Timer(1.0, os.kill, (out.pid, signal.SIGKILL))
    killer.start()
    started = time.monotonic()
    with at_most(10), pytest.raises(InputError, match="failed: ffmpeg exited with status -9"):
        for i in range(10_000):
            out.write(frame(i), tone(i))
    assert 1.0 <= time.monotonic() - started < 5 and 0 < out.frames_written < 10_000
    killer.join()
    with pytest.raises(ValueError, match="closed"):
        out.write(frame(0), tone(0))


@pytest.mark.slow          # real processes on the wall clock
def test_close_gives_up_on_a_receiver_that_never_comes(tmp_path):
    out = StreamOutput(f"srt://127.0.0.1:{free_port()}?mode=listener", SIZE, RATE, "yuv420p")
    out.write(frame(0), tone(0))
    with at_most(10), pytest.raises(InputError, match="ffmpeg had not finished 1 s after the end"):
        out.close(timeout=1)
    assert not out.alive()


def test_a_wrong_frame_is_refused(tmp_path):
    with StreamOutput(str(tmp_path / "x.ts"), SIZE, RATE, "yuv420p") as out:
        with pytest.raises(ValueError, match="yuv420p frame of 160x96 is 23040 bytes"):
            out.write(np.zeros((96, 160, 3), np.uint8), tone(0))
        with pytest.raises(ValueError, match="int16"):
            out.write(frame(0), np.zeros(640, np.int32))
        out.write(frame(0), tone(0).astype(np.float32) / 32768)
    assert out.frames_written == 1 and (tmp_path / "x.ts").stat().st_size > 0


@pytest.mark.parametrize("dest, kind", [
    ("out.ts", "ts file"), ("a/b/live.M3U8", "hls"), ("udp://239.0.0.1:5000", "udp"),
    ("srt://host:9000?mode=listener", "srt"), ("rtmp://host/live/key", "rtmp"),
])
def test_destination_kinds(dest, kind):
    assert describe_destination(dest) == kind


@pytest.mark.parametrize("dest, error, says", [
    ("ftp://host/live.ts", UsageError, "not a stream destination; give one of: a path ending .ts; .* rtmp://HOST/APP"),
    ("{tmp}/out.mp4", UsageError, "out.mp4: not a stream destination; give one of"),
    ("{tmp}/missing/out.ts", InputError, "directory .*missing does not exist"),      # exit 3, as the table says
    ("{tmp}/folder.ts", InputError, "is a directory"),
    ("udp://127.0.0.1", UsageError, "needs a host and a port"),
    ("srt://:9000", UsageError, "needs a host and a port"),
    ("srt://host:9000?mode=server", UsageError, "SRT mode 'server' is not caller, listener or rendezvous"),
    ("udp://host:99999", UsageError, "the port is not a number"),
    ("rtmp://host", UsageError, "needs the application and stream key"),
])
def test_bad_destinations_are_refused_in_one_line(tmp_path, dest, error, says):
    (tmp_path / "folder.ts").mkdir()
    dest = dest.format(tmp=tmp_path)
    for check in (check_destination, lambda d: StreamOutput(d, SIZE, RATE, "yuv420p")):
        with pytest.raises(error, match=says) as caught:
            check(dest)
        assert "\n" not in str(caught.value) and str(caught.value).startswith(dest)
