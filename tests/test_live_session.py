"""`ditto-fast live` end to end, as a user runs it: a real process with tiny networks, a small registered avatar, speech
from a file, stdin, a FIFO that goes quiet or a UDP feed, and the stream received by real ffmpeg receivers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from support import free_port

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()


@pytest.fixture(scope="module")
def live_env(tmp_path_factory, tiny_checkpoints):
    """A store holding avatar 'small': a 1 s 640x360 anchor registered with the tiny checkpoints."""
    pytest.importorskip("mediapipe")
    from synthetic import write_anchor_video

    from ditto_fast.avatar.register import register_avatar

    root = tmp_path_factory.mktemp("live")
    home = root / "home"
    video = write_anchor_video(root / "small.mp4", 25, size=(640, 360), face_px=90, bt709=True)
    env = {**os.environ, "DITTO_FAST_HOME": str(home), "DITTO_FAST_CHECKPOINTS": str(tiny_checkpoints),
           "DITTO_FAST_CPU_PRECISION": "fp32"}
    old = os.environ.get("DITTO_FAST_HOME")
    os.environ["DITTO_FAST_HOME"] = str(home)
    try:
        register_avatar(video, name="small", checkpoints=tiny_checkpoints, device="cpu")
    finally:
        os.environ.pop("DITTO_FAST_HOME") if old is None else os.environ.__setitem__("DITTO_FAST_HOME", old)
    return env


def speech(path: Path, seconds: float, rate: int = 16000, channels: int = 1) -> Path:
    """A voiced test signal (a 140 Hz buzz with syllable-like bursts) as a WAV."""
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sign(np.sin(2 * np.pi * 140 * t)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) ** 2
    pcm = (np.repeat(x[:, None], channels, 1) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_stream_left_running():
    """A test that fails while its stream runs does not leave the stream rendering behind it."""
    yield
    while _STARTED:
        p = _STARTED.pop()
        if p.poll() is None:
            p.kill()
            p.wait()


def live(env: dict, *args, stdin=None, **kw) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "ditto_fast.cli", "live", "--avatar", "small", *map(str, args)],
                         env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    _STARTED.append(p)
    return p


def streams(path: Path) -> dict:
    """Duration, and the codec of each stream of a media file, as ffmpeg decodes it to the end."""
    res = subprocess.run([FFMPEG, "-hide_banner", "-nostdin", "-i", str(path), "-f", "null", "-"],
                         capture_output=True, text=True)
    lines = res.stderr.splitlines()
    inputs = lines[:next((k for k, ln in enumerate(lines) if ln.startswith("Output #0")), len(lines))]
    video = [ln for ln in inputs if "Video:" in ln and "Stream #0" in ln]
    audio = [ln for ln in inputs if "Audio:" in ln and "Stream #0" in ln]
    times = [ln.split("time=")[1].split()[0] for ln in lines if "time=" in ln]
    h, m, s = (times[-1] if times else "0:0:0").split(":")
    return {"video": video, "audio": audio, "seconds": int(h) * 3600 + int(m) * 60 + float(s), "rc": res.returncode,
            "err": res.stderr[-400:]}


def mediainfo(path: Path) -> dict | None:
    """What mediainfo (the reader playout and QC tools use) says of a stream file, or None where it is not installed."""
    if not shutil.which("mediainfo"):
        return None
    general, video, audio = (subprocess.run(["mediainfo", f"--Inform={form}", str(path)], capture_output=True,
                                            text=True).stdout.strip().split("|")
                             for form in ("General;%Format%|%Duration%", "Video;%Format%|%Width%x%Height%|%FrameRate%",
                                          "Audio;%Format%|%Channels%"))
    return {"format": general[0], "seconds": float(general[1]) / 1000, "video": video, "audio": audio}


@pytest.mark.slow          # a real stream in real time
def test_file_to_ts_stop_at_end(live_env, tmp_path):
    wav = speech(tmp_path / "s.wav", 2.0, 44100, 2)
    out, stats = tmp_path / "out.ts", tmp_path / "stats.json"
    p = live(live_env, "--audio-in", wav, "--out", out, "--stop-at-end", "--stats", stats)
    _, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    info = streams(out)
    assert info["rc"] == 0 and len(info["video"]) == 1 and len(info["audio"]) == 1, info
    assert "640x360" in info["video"][0] and "h264" in info["video"][0]
    s = json.loads(stats.read_text())
    assert 1.9 <= s["speech_seconds"] <= 2.1, s
    # the stream holds the speech and what came before it (the session's start), and nothing stalls
    assert s["stream_seconds"] >= 2.0 and abs(info["seconds"] - s["stream_seconds"]) < 0.3, (info, s)
    assert s["frames"]["sent"] == round(s["stream_seconds"] * 25)
    f = s["frames"]                         # the line's parts add up; skipped are among the repeated and held
    assert f["on_time"] + f["repeated"] + f["held"] == f["sent"] and f["skipped"] <= f["repeated"] + f["held"], f
    assert s["first_frame_latency_s"] is not None and 0 < s["first_frame_latency_s"] < s["latency_s"]["max"] + 0.05
    assert "live:" in err and "first frame" in err
    mi = mediainfo(out)
    if mi is not None:
        assert mi["format"] == "MPEG-TS" and mi["video"] == ["AVC", "640x360", "25.000"], mi
        assert mi["audio"] == ["AAC", "2"] and abs(mi["seconds"] - s["stream_seconds"]) < 0.1, (mi, s)


@pytest.mark.slow          # a real stream in real time
def test_stdin_fifo_goes_quiet_and_sigterm_ends_cleanly(live_env, tmp_path):
    """Speech on stdin, then nothing for 3 s (the stream goes on: idle motion), then SIGTERM: exit 0, a playable file
    whose length is the wall time streamed, not the speech's."""
    out, stats = tmp_path / "quiet.ts", tmp_path / "stats.json"
    p = live(live_env, "--audio-in", "-", "--out", out, "--stats", stats, stdin=subprocess.PIPE)
    pcm = (0.3 * np.sin(2 * np.pi * 180 * np.arange(16000) / 16000) * 32767).astype(np.int16).tobytes()
    os.write(p.stdin.fileno(), pcm)                 # 1 s of speech at once (a TTS answer), then quiet
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 200_000):
        time.sleep(0.2)
    time.sleep(3)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    s = json.loads(stats.read_text())
    assert s["ended_by"] == "interrupt"
    assert 0.9 <= s["speech_seconds"] <= 1.05
    assert s["stream_seconds"] > 3.0, s                 # silence kept it going
    info = streams(out)
    assert info["rc"] == 0 and len(info["video"]) == 1 and len(info["audio"]) == 1
    assert abs(info["seconds"] - s["stream_seconds"]) < 0.5, (info, s)


@pytest.mark.slow          # a real stream in real time
def test_udp_in_srt_out(live_env, tmp_path):
    """A UDP speech feed in, SRT out to a real ffmpeg receiver listening (our stream calls it)."""
    port_in, port_out = free_port(), free_port()
    received = tmp_path / "got.ts"
    rx = subprocess.Popen([FFMPEG, "-hide_banner", "-nostdin", "-y", "-i",
                           f"srt://127.0.0.1:{port_out}?mode=listener&timeout=60000000", "-c", "copy", str(received)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    p = live(live_env, "--audio-in", f"udp://127.0.0.1:{port_in}", "--out", f"srt://127.0.0.1:{port_out}")
    first = p.stderr.readline()                  # the engine is loaded: the feed is listened to from now on
    assert first.startswith("live: small to srt://"), first
    time.sleep(1)
    tx = subprocess.Popen([FFMPEG, "-hide_banner", "-nostdin", "-re", "-f", "lavfi", "-i", "sine=f=200:d=2",
                           "-ar", "48000", "-c:a", "mp2", "-f", "mpegts", f"udp://127.0.0.1:{port_in}?pkt_size=1316"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tx.wait(timeout=30)
    time.sleep(4)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, first + err
    rx.wait(timeout=30)
    info = streams(received)
    assert len(info["video"]) == 1 and len(info["audio"]) == 1 and info["seconds"] > 3.0, (info, err)


@pytest.mark.slow          # a real stream in real time
def test_udp_and_hls_out(live_env, tmp_path):
    port = free_port()
    received = tmp_path / "udp.ts"
    rx = subprocess.Popen([FFMPEG, "-hide_banner", "-nostdin", "-y", "-i", f"udp://127.0.0.1:{port}?timeout=30000000",
                           "-c", "copy", str(received)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wav = speech(tmp_path / "s.wav", 1.5)
    p = live(live_env, "--audio-in", wav, "--out", f"udp://127.0.0.1:{port}", "--stop-at-end")
    _, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    rx.send_signal(signal.SIGINT)
    rx.wait(timeout=30)
    info = streams(received)
    assert len(info["video"]) == 1 and len(info["audio"]) == 1 and info["seconds"] > 1.0, info

    playlist = tmp_path / "hls" / "live.m3u8"
    playlist.parent.mkdir()
    p = live(live_env, "--audio-in", wav, "--out", playlist, "--stop-at-end")
    _, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    text = playlist.read_text()
    assert "#EXT-X-ENDLIST" in text
    segments = [playlist.parent / ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert segments and all(s.exists() for s in segments)
    info = streams(playlist)
    assert len(info["video"]) == 1 and len(info["audio"]) == 1 and info["seconds"] > 1.0, info
    mi = mediainfo(playlist)
    if mi is not None:
        assert mi["format"] == "HLS" and mi["video"] == ["AVC", "640x360", "25.000"], mi
        assert mi["audio"] == ["AAC", "2"] and abs(mi["seconds"] - info["seconds"]) < 0.1, (mi, info)


@pytest.mark.slow          # a real stream in real time
def test_force_replaces_the_whole_playlist(live_env, tmp_path):
    """--force onto yesterday's HLS playlist: the new playlist and its own segments, none of yesterday's left
    beside it (its later segments stayed, a recording that was half today's and half yesterday's)."""
    out = tmp_path / "show.m3u8"
    out.write_text("#EXTM3U\n" + "".join(f"#EXTINF:1.0,\nshow_{k:05d}.ts\n" for k in range(60)) + "#EXT-X-ENDLIST\n")
    for k in range(60):
        (tmp_path / f"show_{k:05d}.ts").write_bytes(b"yesterday")
    p = live(live_env, "--audio-in", speech(tmp_path / "s.wav", 1.0), "--out", out, "--stop-at-end", "--force",
             "--quiet")
    _, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    listed = [ln for ln in out.read_text().splitlines() if ln and not ln.startswith("#")]
    beside = sorted(f.name for f in tmp_path.glob("show_*.ts"))
    assert 0 < len(listed) < 60 and beside == sorted(listed), (listed, beside)
    assert all((tmp_path / name).read_bytes() != b"yesterday" for name in listed)


@pytest.mark.slow          # real processes end to end
@pytest.mark.parametrize("args, code, words", [
    (["--audio-in", "missing.wav", "--out", "x.ts"], 3, "missing.wav"),
    (["--audio-in", "ftp2://x", "--out", "x.ts"], 2, "ftp2://x"),
    (["--audio-in", "-", "--out", "x.mp4"], 2, "x.mp4"),
    (["--audio-in", "-", "--out", "x.ts", "--emotion", '{"default": "happy"}'], 2, "emotion"),
    (["--audio-in", "-", "--out", "x.ts", "--codec", "prores"], 2, "prores"),
    (["--audio-in", "-", "--out", "x.ts", "--overlap", "20"], 2, "--overlap"),
    (["--audio-in", "-", "--out", "x.ts", "--max-latency", "0.1"], 2, "--max-latency"),
])
def test_bad_input_is_one_line(live_env, tmp_path, args, code, words):
    p = live(live_env, *args, cwd=tmp_path)
    _, err = p.communicate(timeout=120)
    assert p.returncode == code, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], err
    assert not (tmp_path / "x.ts").exists()


@pytest.mark.slow          # real processes on the wall clock
def test_numbers_on_the_command_line_are_numbers(live_env, tmp_path):
    """--max-latency 5 is taken (a float setting given as text), and the next refusal is the unknown avatar's."""
    p = subprocess.run([sys.executable, "-m", "ditto_fast.cli", "live", "--avatar", "nobody", "--audio-in", "-",
                        "--out", str(tmp_path / "x.ts"), "--max-latency", "5"], env=live_env, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert p.returncode == 5 and "nobody" in p.stderr, p.stderr


@pytest.mark.slow          # real processes on the wall clock
def test_random_bytes_on_stdin_end_the_stream_with_exit_3(live_env, tmp_path):
    """Bytes that are neither raw speech nor a container are refused in one line, and the stream ends (not silence
    for ever): exit 3, without --stop-at-end."""
    out = tmp_path / "noise.ts"
    noise = np.random.default_rng(1).integers(0, 256, 64_000, dtype=np.uint8).tobytes()
    p = live(live_env, "--audio-in", "-", "--out", out, "--quiet", stdin=subprocess.PIPE)
    try:
        p.stdin.buffer.write(noise)
        p.stdin.flush()
        _, err = p.communicate(timeout=120)             # before: noise on air, for ever
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 3, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "stdin: the first bytes are neither s16le 16 kHz mono speech" in lines[0], err
    assert not out.exists()                             # before: a 0-byte .ts that refused the corrected rerun


@pytest.mark.slow          # real processes on the wall clock
def test_empty_stdin_is_exit_3_and_leaves_nothing_behind(live_env, tmp_path):
    """A source that ends before its first speech has failed (the README's exit 3), without --stop-at-end too: one
    line, and neither the stream's file nor --stats left to block the rerun (before: silence streamed for ever)."""
    out, stats = tmp_path / "empty.m3u8", tmp_path / "stats.json"
    p = live(live_env, "--audio-in", "-", "--out", out, "--stats", stats, "--quiet", stdin=subprocess.DEVNULL)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 3, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "stdin: ended before any speech came" in lines[0], err
    assert sorted(os.listdir(tmp_path)) == []
