"""Speech arriving: a file at its own pace, PCM on a pipe or stdin, a named pipe that goes quiet, a UDP stream fed by
a real ffmpeg sender, and the refusals at open."""

from __future__ import annotations

import contextlib
import http.server
import os
import struct
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


@pytest.mark.slow          # real processes on the wall clock
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


@pytest.mark.slow          # real processes on the wall clock
def test_a_named_pipe_that_goes_quiet_has_not_ended(tmp_path):
    """A writer that goes quiet is no end; with --stop-at-end its close is."""
    fifo = tmp_path / "tts.pcm"
    os.mkfifo(fifo)
    quiet, close = threading.Event(), threading.Event()

    def writer():
        with open(fifo, "wb") as f:
            f.write(np.ones(SAMPLE_RATE // 2, np.int16).tobytes())
            f.flush()
            quiet.set()
            close.wait(10)

    with at_most(10), open_source(str(fifo), stop_at_end=True) as source:
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


@pytest.mark.slow          # real processes on the wall clock
def test_a_named_pipe_hears_every_writer(tmp_path):
    """A TTS that opens the pipe for each answer: the second writer is heard too (the pipe is opened again), and
    each writer's bytes are sniffed anew (raw PCM, then a WAV)."""
    fifo = tmp_path / "tts.pcm"
    os.mkfifo(fifo)
    wav = tmp_path / "answer.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes((np.ones(4000) * 1000).astype("<i2").tobytes())
    answers = [np.full(SAMPLE_RATE // 2, 2000, "<i2").tobytes(), wav.read_bytes()]
    with at_most(15), open_source(str(fifo)) as source:
        source.start()
        for data in answers:
            with open(fifo, "wb") as f:
                f.write(data)
            time.sleep(0.5)
        assert wait_until(lambda: source.received >= SAMPLE_RATE - 64, 3), source.received
        assert not source.ended
        x = source.take(2 * SAMPLE_RATE)
    assert abs(len(x) - SAMPLE_RATE) < 64, len(x)
    assert np.allclose(x[:SAMPLE_RATE // 2], 2000 / 32768)
    assert abs(np.median(x[SAMPLE_RATE // 2:]) - 1000 / 32768) < 1e-3     # the WAV's samples, not its header


@pytest.mark.slow          # real processes on the wall clock
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


# ----------------------------------------------------------------------------- what comes on stdin: sniffed
def encoded(args: list[str], seconds: float = 1.0, freq: int = 440) -> bytes:
    """A tone encoded by ffmpeg (`args`: the output's options up to the format), as the bytes a pipe would carry."""
    res = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i",
                          f"sine=frequency={freq}:duration={seconds}", *args, "pipe:1"],
                         capture_output=True, check=True)
    return res.stdout


def stdin_samples(data: bytes, timeout: float = 10) -> tuple[np.ndarray, str | None]:
    """What a source on a pipe makes of `data` written into it at once and closed."""
    read_end, write_end = os.pipe()
    try:
        with at_most(timeout), open_source("-", stdin_fd=read_end) as source:
            source.start()
            writer = threading.Thread(target=lambda: (os.write(write_end, data), os.close(write_end)))
            writer.start()
            assert wait_until(lambda: source.ended, timeout - 1)
            writer.join()
            return source.take(1 << 24), source.error
    finally:
        os.close(read_end)


def tone_level(x: np.ndarray) -> float:
    """The tone's peak over its middle (a start or an end of a resampler's filter left out)."""
    return float(np.abs(x[len(x) // 4:3 * len(x) // 4]).max())


def ffmpeg_decoded(data: bytes) -> np.ndarray:
    """`data` as ffmpeg decodes it to 16 kHz mono, from a file: what the source should hear."""
    res = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-i", "pipe:0",
                          "-ac", "1", "-ar", str(SAMPLE_RATE), "-f", "s16le", "pipe:1"], input=data,
                         capture_output=True, check=True)
    return np.frombuffer(res.stdout, "<i2").astype(np.float32) / 32768


@pytest.mark.parametrize("args, how", [
    (["-ar", "44100", "-ac", "2", "-c:a", "pcm_s16le", "-f", "wav"], "a 16-bit WAV, read here"),
    (["-ar", "8000", "-c:a", "pcm_mulaw", "-f", "wav"], "a u-law WAV, ffmpeg's"),
    (["-ar", "22050", "-c:a", "libmp3lame", "-f", "mp3"], "an MP3 with an ID3 tag"),
    (["-ar", "24000", "-c:a", "libmp3lame", "-write_xing", "0", "-id3v2_version", "0", "-f", "mp3"], "MP3 frames"),
    (["-ar", "48000", "-c:a", "flac", "-f", "flac"], "FLAC"),
    (["-ar", "48000", "-c:a", "libopus", "-f", "ogg"], "Ogg Opus"),
    (["-ar", "48000", "-c:a", "mp2", "-f", "mpegts"], "MPEG-TS"),
    (["-ar", "16000", "-c:a", "aac", "-f", "adts"], "AAC in ADTS"),
])
def test_a_container_on_stdin_is_decoded_not_played_as_pcm(args, how):
    data = encoded(args, seconds=1.5)
    x, error = stdin_samples(data)
    assert error is None, (how, error)
    reference = ffmpeg_decoded(data)
    assert abs(len(x) - len(reference)) < 0.02 * SAMPLE_RATE and len(x) > 1.4 * SAMPLE_RATE, (how, len(x))
    want = tone_level(reference)
    assert 0.03 < want and abs(tone_level(x) - want) < 0.1 * want, (how, tone_level(x), want)    # not noise


@pytest.mark.parametrize("sized", [False, True])
def test_wav_after_wav_on_stdin_each_at_its_rate(tmp_path, sized):
    """A TTS writing one WAV per answer into the same pipe: each header read, each at its own rate, whether the
    writer knew its sizes (a file) or not (a WAV written to a pipe says 'to the end')."""
    first = encoded(["-ar", "22050", "-c:a", "pcm_s16le", "-f", "wav"], seconds=1.0)
    second = encoded(["-ar", "48000", "-ac", "2", "-c:a", "pcm_s16le", "-f", "wav"], seconds=0.5, freq=300)
    if sized:                           # written to a file, read back: the sizes filled in
        for name, data in (("first", first), ("second", second)):
            subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-loglevel", "error", "-i", "pipe:0", "-c", "copy",
                            str(tmp_path / f"{name}.wav")], input=data, check=True)
        first, second = (tmp_path / "first.wav").read_bytes(), (tmp_path / "second.wav").read_bytes()
    x, error = stdin_samples(first + second)
    assert error is None
    assert abs(len(x) - 1.5 * SAMPLE_RATE) < 0.05 * SAMPLE_RATE, len(x)
    assert float(np.abs(x).max()) < 0.13                            # the tones (1/8 and 1/8 at -3 dB), no header


def test_random_bytes_on_stdin_are_refused_in_one_line():
    rng = np.random.default_rng(0)
    x, error = stdin_samples(rng.integers(0, 256, 64_000, dtype=np.uint8).tobytes())
    assert len(x) == 0 and error is not None and "\n" not in error
    assert error.startswith("stdin: the first bytes are neither s16le 16 kHz mono speech") and "WAV, MP3" in error


def test_raw_pcm_that_starts_like_an_mpeg_frame_is_raw():
    """Quiet PCM whose first bytes happen to read as an MPEG audio header (FF FF E7 FF: -1, -25) stays PCM."""
    from ditto_fast.live.containers import sniff

    t = np.arange(8000) / SAMPLE_RATE
    pcm = np.concatenate([[-1, -25], (3000 * np.sin(2 * np.pi * 200 * t)).astype(np.int16)]).astype("<i2").tobytes()
    assert pcm[:4] == b"\xff\xff\xe7\xff"
    assert sniff(pcm[:4096]).kind == "raw"
    x, error = stdin_samples(pcm)
    assert error is None and len(x) == 8002


# ----------------------------------------------------------------------------- URLs: a local HTTP server
def streaming_wav_header(rate: int) -> bytes:
    """A mono 16-bit WAV header as a writer that streams gives it (sizes unknown: 0xFFFFFFFF)."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, 2 * rate, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


@contextlib.contextmanager
def http_server(routes: dict):
    """A local HTTP server on a free port in a thread; `routes`: path -> handler(request) writing the answer."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            route = routes.get(self.path)
            if route is None:
                self.send_error(404, "Not Found")
                return
            try:
                route(self)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def paced_speech(rate: int, seconds: float, then_hold: float):
    """A handler: a streaming WAV at `rate`, sent at its own pace, then the connection held open for `then_hold` s."""
    def answer(request):
        request.send_response(200)
        request.send_header("Content-Type", "audio/wav")
        request.end_headers()
        request.wfile.write(streaming_wav_header(rate))
        tone = (8000 * np.sin(2 * np.pi * 300 * np.arange(int(rate * seconds)) / rate)).astype("<i2").tobytes()
        step = rate // 50 * 2                       # 20 ms a write
        for i in range(0, len(tone), step):
            request.wfile.write(tone[i:i + step])
            request.wfile.flush()
            time.sleep(0.02)
        time.sleep(then_hold)
    return answer


@pytest.mark.slow          # real processes on the wall clock
def test_an_8khz_wav_from_a_url_is_heard_as_it_comes():
    """3 s of 8 kHz speech on a feed that stays open: heard at once, not held back until 64 KiB came (ffmpeg's WAV
    reader looks for S/PDIF in its first 64 KiB: 4 s of 8 kHz, more than this utterance)."""
    with http_server({"/tts.wav": paced_speech(8000, 3.0, then_hold=6.0)}) as base, at_most(15), \
            open_source(f"{base}/tts.wav") as source:
        started = time.monotonic()
        source.start()
        assert wait_until(lambda: source.received > 0, 1.5), "no speech in the first 1.5 s"
        assert source.first_sample_at - started < 1.0
        assert wait_until(lambda: source.received >= 2.8 * SAMPLE_RATE, 3.5), source.received / SAMPLE_RATE
        assert not source.ended
        x = source.take(4 * SAMPLE_RATE)
    assert 0.2 < float(np.abs(x[SAMPLE_RATE:2 * SAMPLE_RATE]).max()) < 0.3        # the tone, not its header


@pytest.mark.slow          # real processes on the wall clock
def test_a_url_that_stalls_ends_a_stop_at_end_source(monkeypatch):
    import ditto_fast.live.sources as sources

    monkeypatch.setattr(sources, "STALL_S", 1.0)
    with http_server({"/tts.wav": paced_speech(16000, 0.5, then_hold=30.0)}) as base, at_most(10):
        with open_source(f"{base}/tts.wav", stop_at_end=True) as source:
            source.start()
            assert wait_until(lambda: source.ended, 5), "a stalled URL never ends"
            assert source.received >= 0.45 * SAMPLE_RATE
            assert "nothing came for 1 s; the source has stalled" in source.error and "\n" not in source.error
        with open_source(f"{base}/tts.wav") as source:             # a live stream (no --stop-at-end) waits
            source.start()
            time.sleep(2.5)
            assert not source.ended and source.received >= 0.45 * SAMPLE_RATE


def test_a_url_that_answers_404_is_refused_before_anything_loads():
    from ditto_fast.live.sources import check_source_url

    with http_server({"/here.wav": paced_speech(16000, 0.1, then_hold=0)}) as base, at_most(10):
        check_source_url(f"{base}/here.wav")
        with pytest.raises(InputError, match=r"missing.wav: the server answers 404 Not Found; check the URL"):
            check_source_url(f"{base}/missing.wav")
    with pytest.raises(InputError, match="cannot be read .*refused"):
        check_source_url(f"http://127.0.0.1:{free_port()}/x.wav")


def test_a_handover_that_comes_as_the_source_closes_starts_no_ffmpeg():
    """A URL's reader hands its bytes to a direct ffmpeg (a container read better from the URL itself) just as
    close() stops the source: nothing is started after close(), so no ffmpeg is left that the reader, or close(),
    would wait on for ever (a live URL never ends)."""
    with http_server({"/tts.wav": paced_speech(16000, 0.5, then_hold=30.0)}) as base, at_most(10):
        source = open_source(f"{base}/tts.wav").start()
        source.close()
        fetching = source._proc
        source._bytes.handover = b"RIFF"                # the reader's next look finds a handover due
        handed = source._taken_over()
        try:
            assert not handed and source._proc is fetching and fetching.poll() is not None
        finally:
            if source._proc is not fetching:
                source._proc.kill()
                source._proc.wait()
