"""VideoWriter: H.264 + AAC in one ffmpeg process, atomic rename, abort/cleanup, output path checks."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import wave
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.core.errors import DittoError, InputError, UsageError
from ditto_fast.encoding import writer as writer_mod
from ditto_fast.encoding.writer import VideoWriter, check_output_path

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()
W, H = 64, 48


def write_sine_wav(path: Path, seconds: float, rate: int = 16000) -> Path:
    """Mono 16-bit 440 Hz sine."""
    t = np.arange(int(round(seconds * rate))) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


def probe(path: Path) -> str:
    """ffmpeg -i stderr (stream descriptions)."""
    return subprocess.run([FFMPEG, "-hide_banner", "-i", str(path)], capture_output=True, text=True).stderr


def audio_seconds(path: Path) -> float:
    """Decoded length of the first audio stream."""
    pcm = subprocess.run([FFMPEG, "-v", "error", "-i", str(path), "-map", "0:a:0", "-f", "s16le", "-ac", "1",
                          "-ar", "48000", "-"], capture_output=True, check=True).stdout
    return len(pcm) / 2 / 48000


def frames(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (H, W, 3), dtype=np.uint8) for _ in range(n)]


def leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


@pytest.mark.parametrize("audio_s", [2.0, 1.5])
def test_writes_h264_with_aac_of_video_length(tmp_path, audio_s):
    wav = write_sine_wav(tmp_path / "speech.wav", audio_s)
    out = tmp_path / "out.mp4"
    with VideoWriter(out, (W, H), fps=25, audio_path=wav, frames=50) as vw:
        for f in frames(50):
            vw.write(f)
    assert out.is_file()
    n, secs = imageio_ffmpeg.count_frames_and_secs(str(out))
    assert n == 50 and secs == pytest.approx(2.0, abs=0.04)
    info = probe(out)
    assert re.search(r"Video: h264 .*yuv420p", info), info
    assert "Audio: aac" in info, info
    # audio padded/trimmed to the video: 2.0 s within one frame
    assert audio_seconds(out) == pytest.approx(2.0, abs=0.04)
    # +faststart: the index precedes the media data
    head = out.read_bytes()
    assert head.find(b"moov") < head.find(b"mdat")
    assert leftovers(tmp_path, {"speech.wav", "out.mp4"}) == []


def test_no_audio_and_frame_content(tmp_path):
    out = tmp_path / "plain.mp4"
    flat = [np.full((H, W, 3), (30 + 40 * i, 200 - 30 * i, 90), np.uint8) for i in range(5)]
    with VideoWriter(out, (W, H), crf=10) as vw:
        for f in flat:
            vw.write(f)
    assert "Audio" not in probe(out)
    gen = imageio_ffmpeg.read_frames(str(out))
    next(gen)
    got = [np.frombuffer(b, np.uint8).reshape(H, W, 3) for b in gen]
    assert len(got) == 5
    for g, f in zip(got, flat):
        assert np.abs(g.astype(int) - f).mean() < 3


def test_replaces_existing_output_only_on_success(tmp_path):
    out = tmp_path / "out.mp4"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with VideoWriter(out, (W, H)) as vw:
            vw.write(frames(1)[0])
            raise RuntimeError("render failed")
    assert out.read_bytes() == b"old"
    assert leftovers(tmp_path, {"out.mp4"}) == []
    with VideoWriter(out, (W, H)) as vw:
        vw.write(frames(1)[0])
    assert out.read_bytes() != b"old"


def test_abort_leaves_nothing(tmp_path):
    vw = VideoWriter(tmp_path / "out.mp4", (W, H), audio_path=write_sine_wav(tmp_path / "a.wav", 1.0), frames=3)
    for f in frames(3):
        vw.write(f)
    proc = vw._proc
    vw.abort()
    assert proc.poll() is not None
    assert leftovers(tmp_path, {"a.wav"}) == []
    vw.abort()     # idempotent


def test_keyboard_interrupt_aborts(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with VideoWriter(tmp_path / "out.mp4", (W, H)) as vw:
            vw.write(frames(1)[0])
            raise KeyboardInterrupt
    assert vw._proc.poll() is not None
    assert list(tmp_path.iterdir()) == []


def test_ffmpeg_killed_mid_write_is_a_clear_error(tmp_path):
    out = tmp_path / "out.mp4"
    vw = VideoWriter(out, (W, H))
    vw.write(frames(1)[0])
    vw._proc.kill()
    vw._proc.wait()
    with pytest.raises(DittoError, match=rf"writing {re.escape(str(out))} failed"):
        for f in frames(20):
            vw.write(f)
        vw.close()
    assert list(tmp_path.iterdir()) == []


def test_disk_full_is_a_clear_error(tmp_path, monkeypatch):
    """Emulate a full disk: ffmpeg may only write 20 kB (RLIMIT_FSIZE -> EFBIG on write)."""
    def limited(cmd, stderr_file, pass_fds=()):
        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr_file,
                                preexec_fn=limit, pass_fds=pass_fds)

    monkeypatch.setattr(writer_mod, "_spawn", limited)
    out = tmp_path / "out.mp4"
    rng = np.random.default_rng(1)
    with pytest.raises(DittoError) as err:
        with VideoWriter(out, (128, 96), crf=0, preset="ultrafast") as vw:
            for _ in range(60):
                vw.write(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8))
    msg = str(err.value)
    assert msg.startswith(f"writing {out} failed: ") and "\n" not in msg
    assert len(msg) > len(f"writing {out} failed: ") + 5
    assert list(tmp_path.iterdir()) == []


def test_bad_output_paths(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        check_output_path(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "out.mp4")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        check_output_path(tmp_path / "afile" / "out.mp4")
    with pytest.raises(InputError, match="cannot write"):
        check_output_path("/proc/out.mp4")          # not writable, even for root
    with pytest.raises(InputError):
        VideoWriter(tmp_path / "missing" / "out.mp4", (W, H))
    assert check_output_path(tmp_path / "ok.mp4") == tmp_path / "ok.mp4"
    assert sorted(os.listdir(tmp_path)) == ["afile"]


@pytest.mark.parametrize("name,better", [(".mp4", "news.mp4"), ("..mp4", "news.mp4"), (".hidden.mp4", "hidden.mp4"),
                                         ("...", "news.mp4")])
def test_output_names_starting_with_a_dot_are_refused(tmp_path, name, better):
    """Only an extension, or a hidden file: it would not show in a listing and looks like our temporaries."""
    with pytest.raises(UsageError) as e:
        check_output_path(tmp_path / name)
    assert str(e.value) == (f"{tmp_path / name}: the output name starts with a dot (a hidden file, or only an "
                            f"extension); give a name such as {tmp_path / better}")
    with pytest.raises(UsageError):
        VideoWriter(tmp_path / name, (W, H))
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments(tmp_path):
    with pytest.raises(InputError, match="audio file not found"):
        VideoWriter(tmp_path / "o.mp4", (W, H), audio_path=tmp_path / "nope.wav")
    with pytest.raises(ValueError, match="give frames="):          # the audio's length must be known up front
        VideoWriter(tmp_path / "o.mp4", (W, H), audio_path=write_sine_wav(tmp_path / "a.wav", 0.2))
    (tmp_path / "a.wav").unlink()
    with pytest.raises(ValueError, match="even"):
        VideoWriter(tmp_path / "o.mp4", (63, 48))
    with VideoWriter(tmp_path / "o.mp4", (W, H)) as vw:
        with pytest.raises(ValueError, match="frame must be"):
            vw.write(np.zeros((H, W + 2, 3), np.uint8))
        vw.write(frames(1)[0])
    assert sorted(os.listdir(tmp_path)) == ["o.mp4"]


# ----------------------------------------------------------------------------- dead writers' leftovers (issue 15)
_HOLD_A_WRITER = """
import sys, numpy as np
from ditto_fast.encoding.writer import VideoWriter
vw = VideoWriter(sys.argv[1], (64, 48))
vw.write(np.zeros((48, 64, 3), np.uint8))
print("writing", flush=True)
sys.stdin.read()
"""


def _writer_process(out: Path) -> subprocess.Popen:
    """A process writing `out` that stays in the middle of it until killed (or its stdin closes)."""
    p = subprocess.Popen([sys.executable, "-c", _HOLD_A_WRITER, str(out)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    return p


def parts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".part" in p.name)


def _wait_writer_gone(path: Path, timeout: float = 20.0) -> None:
    """Wait until nobody holds `path`'s lock (a killed render's ffmpeg finishes on its own, holding it till then)."""
    import fcntl
    import time

    deadline = time.monotonic() + timeout
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{path} still locked"
                time.sleep(0.05)
    finally:
        os.close(fd)


@pytest.mark.slow
def test_dead_renders_partial_files_are_removed_by_the_next_writer_live_ones_kept(tmp_path):
    (tmp_path / ".notes.part.txt").write_text("not ours")            # a user's file that only looks alike
    dead, live = _writer_process(tmp_path / "dead.mp4"), _writer_process(tmp_path / "live.mp4")
    try:
        assert len(parts(tmp_path)) == 3
        dead.kill()                                                  # SIGKILL: no cleanup of its own ran
        dead.wait()
        left = [n for n in parts(tmp_path) if n.startswith(".dead.mp4.part")]
        assert len(left) == 1
        _wait_writer_gone(tmp_path / left[0])
        with VideoWriter(tmp_path / "next.mp4", (W, H)) as vw:       # the next render to that folder
            assert left[0] not in parts(tmp_path)                    # the dead one's file is gone ...
            assert any(n.startswith(".live.mp4.part") for n in parts(tmp_path))   # ... a live one's is kept
            vw.write(frames(1)[0])
        assert (tmp_path / "next.mp4").is_file()
    finally:
        for p in (dead, live):
            p.kill()
            p.wait()
    for name in parts(tmp_path):
        _wait_writer_gone(tmp_path / name)
    from ditto_fast.media.partfiles import remove_stale

    remove_stale(tmp_path, "part")
    assert parts(tmp_path) == [".notes.part.txt"] and not (tmp_path / "live.mp4").exists()


def _x264_threads(path: Path) -> int:
    """The thread count x264 wrote into its settings string (an SEI in the stream)."""
    return int(re.search(rb"x264 - core .*? threads=(\d+) ", path.read_bytes()).group(1))


def test_encoder_threads_auto_is_x264s_own_count_and_a_count_given_is_kept(tmp_path):
    """x264's bytes follow its thread count, which by default it takes from the host's cores (1.5 a core): `threads`
    left out changes nothing in the command; given x264's own count, the same bytes; given another, that count."""
    size, rng = (640, 352), np.random.default_rng(1)
    picture = [rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) for _ in range(12)]

    def write(name: str, threads: int | None) -> Path:
        with VideoWriter(tmp_path / name, size, threads=threads) as vw:
            for f in picture:
                vw.write(f)
            assert ("-threads:v" in vw._proc.args) == (threads is not None)
        return tmp_path / name

    auto = write("auto.mp4", None)
    own = _x264_threads(auto)
    assert write("own.mp4", own).read_bytes() == auto.read_bytes()
    other = 1 if own > 1 else 2
    assert _x264_threads(write("other.mp4", other)) == other
