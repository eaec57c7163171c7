"""Speech arriving: a file at its own pace, PCM on a pipe or stdin, a named pipe that goes quiet, a UDP stream fed by
a real ffmpeg sender, and the refusals at open."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.live.sources import open_source
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE as SAMPLE_RATE
from support import at_most, free_port

REPO = Path(__file__).resolve().parents[1]


def write_wav(path: Path, seconds: float = 1.5, rate: int = 44100) -> Path:
    """A stereo 16-bit WAV of a 440 Hz tone at half scale."""
    t = np.arange(round(seconds * rate)) / rate
    tone = (0.5 * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.repeat(tone, 2).tobytes())
    return path


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_file_arrives_at_its_own_pace(tmp_path):
    wav = write_wav(tmp_path / "speech.wav")
    with at_most(10), open_source(str(wav)) as source:
        started = time.monotonic()
        source.start()
        time.sleep(0.5)
        early = source.available()
        assert 0.25 * SAMPLE_RATE < early < 0.9 * SAMPLE_RATE, early        # about half a second, not all 1.5 s
        assert not source.ended
        assert wait_until(lambda: source.ended, 5)
        finished = time.monotonic() - started
        assert source.error is None
        samples = np.concatenate([source.take(1000) for _ in range(40)])
    assert abs(len(samples) - 1.5 * SAMPLE_RATE) <= 16, len(samples)
    assert source.received == source.taken == len(samples) and source.available() == 0
    assert samples.dtype == np.float32 and 0.45 < np.abs(samples[1000:-1000]).max() < 0.55     # the tone, mixed to mono
    assert finished > 1.3, finished                                                          # paced, not bursted
    first, last = source.arrivals.arrival_time(0), source.arrivals.arrival_time(len(samples) - 1)
    assert first == source.first_sample_at and last - first > 1.2
    assert source.arrivals.arrival_time(len(samples)) is None


def test_pcm_on_a_pipe_keeps_odd_bytes_for_the_next_read(tmp_path):
    pcm = (np.arange(-3000, 3000, 7, dtype=np.int16)).astype("<i2").tobytes()
    read_end, write_end = os.pipe()
    try:
        with at_most(10), open_source("-", stdin_fd=read_end) as source:
            source.start()
            for i, size in enumerate((3, 1, 5, 999, 2, 1)):     # cut in odd places, with pauses between
                offset = sum((3, 1, 5, 999, 2, 1)[:i])
                os.write(write_end, pcm[offset:offset + size])
                time.sleep(0.03)
            os.write(write_end, pcm[1011:])
            os.close(write_end)
            write_end = None
            assert wait_until(lambda: source.ended, 3)
            got = source.take(1 << 20)
        assert source.error is None
        np.testing.assert_array_equal(got, np.frombuffer(pcm, "<i2").astype(np.float32) / 32768)
        os.fstat(read_end)                                      # the caller's descriptor is still open
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)


def test_stdin_of_a_process_is_read_until_its_end():
    script = ("import time; from ditto_fast.live.sources import open_source\n"
              "s = open_source('-').start()\n"
              "while not s.ended: time.sleep(0.01)\n"
              "print(s.received, s.error)")
    pcm = np.zeros(8001, np.int16).tobytes()
    res = subprocess.run([sys.executable, "-c", script], input=pcm, capture_output=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.stdout.decode().split() == ["8001", "None"], res.stderr.decode()[-2000:]


def test_a_named_pipe_that_goes_quiet_has_not_ended(tmp_path):
    fifo = tmp_path / "tts.pcm"
    os.mkfifo(fifo)
    quiet, close = threading.Event(), threading.Event()

    def writer():
        with open(fifo, "wb") as f:
            f.write(np.ones(SAMPLE_RATE // 2, np.int16).tobytes())
            f.flush()
            quiet.set()
            close.wait(10)

    with at_most(10), open_source(str(fifo)) as source:
        source.start()
        thread = threading.Thread(target=writer)
        thread.start()
        try:
            assert quiet.wait(5)
            assert wait_until(lambda: source.received == SAMPLE_RATE // 2, 3)
            time.sleep(1.0)                                 # nothing for a second: not an end
            assert len(source.take(SAMPLE_RATE)) == SAMPLE_RATE // 2
            assert len(source.take(SAMPLE_RATE)) == 0 and not source.ended
        finally:
            close.set()
            thread.join()
        assert wait_until(lambda: source.ended, 2) and source.error is None


def test_a_udp_stream_from_an_ffmpeg_sender(tmp_path):
    port = free_port()
    with at_most(15), open_source(f"udp://127.0.0.1:{port}?timeout=1000000") as source:
        source.start()
        time.sleep(0.3)                                     # ffmpeg bound to the port before the sender starts
        sent = time.monotonic()
        sender = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error",
                                 "-re", "-f", "lavfi", "-i", "sine=frequency=440:duration=1.5", "-f", "mpegts",
                                 f"udp://127.0.0.1:{port}?pkt_size=1316"], capture_output=True, timeout=10)
        assert sender.returncode == 0, sender.stderr.decode()
        assert wait_until(lambda: source.ended, 5)          # the URL's timeout ends the stream
        assert source.error is None
        assert source.first_sample_at - sent < 1.0
        assert abs(source.received - 1.5 * SAMPLE_RATE) < 0.1 * SAMPLE_RATE, source.received
        assert np.abs(source.take(SAMPLE_RATE)).max() > 0.05


def test_an_unreachable_url_is_reported_in_one_line():
    url = f"tcp://127.0.0.1:{free_port()}"
    with at_most(10), open_source(url) as source:
        source.start()
        assert wait_until(lambda: source.ended, 5)
        assert source.error.startswith(url) and "refused" in source.error and "\n" not in source.error
        assert source.received == 0 and source.first_sample_at is None


def test_close_stops_a_source_at_once(tmp_path):
    source = open_source(str(write_wav(tmp_path / "long.wav", seconds=5.0))).start()
    time.sleep(0.2)
    with at_most(3):
        source.close()
        source.close()
    assert not source.ended and source.received < 2 * SAMPLE_RATE


@pytest.mark.parametrize("spec, error, says", [
    ("missing.wav", InputError, "missing.wav: file not found"),
    ("", UsageError, "the speech source is empty; give one of"),
    (".", InputError, "is a directory"),
    ("notaudio.wav", InputError, "notaudio.wav: ffmpeg finds no audio"),
    ("ftp://example.com/a.wav", UsageError, "ftp:// URL; give one of: .*srt://, udp://"),
])
def test_refused_at_open_in_one_line(tmp_path, monkeypatch, spec, error, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notaudio.wav").write_bytes(b"RIFF but not really a wave file" * 10)
    with pytest.raises(error, match=says) as caught:
        open_source(spec)
    assert "\n" not in str(caught.value)
