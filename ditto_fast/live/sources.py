"""Speech arriving while it is spoken, as 16 kHz mono float32 samples that a reader thread buffers: a file decoded at
its own pace, raw PCM on stdin or a named pipe (what a TTS engine writes), or a URL ffmpeg reads live."""

from __future__ import annotations

import bisect
import os
import re
import select
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from types import TracebackType

import imageio_ffmpeg
import numpy as np

from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.core.files import check_path_text, unreadable
from ditto_fast.media.ffpipe import first_stderr_line, own_session, stream_lines, widen_pipe
from ditto_fast.media.inputs import check_input_file
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE

URL_SCHEMES = ("srt", "udp", "rtmp", "http", "https", "rtp", "tcp")
SOURCE_KINDS = ("an audio file (wav, mp3, flac, m4a, ...)", "- (s16le 16 kHz mono on stdin)",
                "a named pipe carrying s16le 16 kHz mono", "a URL (" + ", ".join(f"{s}://" for s in URL_SCHEMES) + ")")
ARRIVALS_KEPT = 8192        # reads whose arrival time is kept (a file's reads are ~23 ms apart: over 3 minutes)
READ_BYTES = 1 << 16
POLL_S = 0.1                # how often a reader waiting for data looks whether it was closed
# ffmpeg's output: s16le 16 kHz mono, each packet flushed at once (ffmpeg's automatic rule does so for a pipe today)
_DECODE = ["-vn", "-sn", "-dn", "-ac", "1", "-ar", str(SPEECH_SAMPLE_RATE), "-f", "s16le", "-flush_packets", "1",
           "pipe:1"]
# a file at its own pace: -re with a 10 ms initial burst (ffmpeg's default burst is half a second, and 0 bursts too)
_PACED = ["-re", "-readrate_initial_burst", "0.01"]
# a live URL: a short probe (64 KiB / 0.3 s finds an audio stream's parameters) so that speech starts at once; not
# -fflags nobuffer, which drops the packets read while probing (the first words)
_LIVE_PROBE = ["-probesize", "65536", "-analyzeduration", "300000"]
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class Arrivals:
    """When a stream's samples arrived: (first sample index, end index, time.monotonic()) of each of the last `kept`
    reads, for latency statistics."""

    def __init__(self, kept: int = ARRIVALS_KEPT) -> None:
        self._reads: deque[tuple[int, int, float]] = deque(maxlen=kept)
        self._lock = threading.Lock()

    def note(self, start: int, end: int, at: float) -> None:
        """Record that samples [start, end) of the stream arrived at `at`."""
        with self._lock:
            self._reads.append((start, end, at))

    def arrival_time(self, index: int) -> float | None:
        """time.monotonic() when stream sample `index` (0: the source's first) arrived; None if it has not yet or
        its read is no longer kept."""
        with self._lock:
            i = bisect.bisect_right(self._reads, index, key=lambda read: read[1])
            if i == len(self._reads) or self._reads[i][0] > index:
                return None
            return self._reads[i][2]


def take_chunks(chunks: deque, n: int) -> np.ndarray:
    """Up to `n` samples off the front of a queue of float32 chunks (a partly taken chunk keeps its rest)."""
    out, need = [], max(0, int(n))
    while need and chunks:
        chunk = chunks[0]
        if len(chunk) <= need:
            out.append(chunks.popleft())
        else:
            out.append(chunk[:need])
            chunks[0] = chunk[need:]
        need -= len(out[-1])
    return np.concatenate(out) if out else np.zeros(0, np.float32)


class AudioSource:
    """Samples read by a thread from ffmpeg's output (`command`: ffmpeg's arguments after the global ones), from a
    file descriptor (`fd`, duplicated: the caller's stays open) or from a named pipe (`fifo`), buffered until taken.

    `ended` turns True when no more samples will come (end of file or stream, ffmpeg exited); `error` then holds a
    one-line reason if the source failed. `name` is the spec, for messages.
    """

    def __init__(self, name: str, *, command: list[str] | None = None, fd: int | None = None,
                 fifo: Path | None = None) -> None:
        if (command is None) + (fd is None) + (fifo is None) != 2:
            raise ValueError("give exactly one of command, fd, fifo")
        self.name = name
        self.sample_rate = SPEECH_SAMPLE_RATE
        self.arrivals = Arrivals()
        self.first_sample_at: float | None = None
        self.received = 0               # samples that have arrived since start()
        self.taken = 0                  # samples take() has returned: the stream index of the next one
        self._command, self._fd, self._fifo = command, fd, fifo
        self._chunks: deque[np.ndarray] = deque()
        self._available = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ended = threading.Event()
        self._error: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stderr = None
        self._read_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------------ reading
    def start(self) -> AudioSource:
        """Start reading (ffmpeg, if any, starts now); returns self."""
        if self._thread is not None or self._closed:
            raise ValueError("start() on a source already started or closed")
        if self._command is not None:
            self._stderr = tempfile.TemporaryFile()
            cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", *self._command]
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr,
                                          start_new_session=own_session(), bufsize=0)
            widen_pipe(self._proc.stdout.fileno())
            self._read_fd = self._proc.stdout.fileno()
        elif self._fd is not None:
            self._read_fd = os.dup(self._fd)
        else:                           # O_NONBLOCK: returns at once, and poll waits for a writer to come
            try:
                self._read_fd = os.open(self._fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                raise unreadable(self._fifo, e, SOURCE_KINDS[2]) from None
        self._thread = threading.Thread(target=self._run, name=f"source {self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        half = b""                      # an odd byte: the first half of the next read's first sample
        try:
            while not self._stop.is_set():
                if not poller.poll(POLL_S * 1000):
                    continue
                try:
                    data = os.read(self._read_fd, READ_BYTES)
                except BlockingIOError:
                    continue
                except OSError as e:
                    self._error = f"{self.name}: reading failed ({e.strerror or e})"
                    break
                if not data:
                    break
                data, cut = half + data, (len(half) + len(data)) & ~1
                half = data[cut:]
                if cut:
                    self._deliver(np.frombuffer(data[:cut], dtype="<i2"))
        finally:
            self._finish()

    def _deliver(self, pcm: np.ndarray) -> None:
        samples = pcm.astype(np.float32) / 32768.0
        now = time.monotonic()
        with self._lock:
            start = self.received
            self._chunks.append(samples)
            self._available += len(samples)
            self.received += len(samples)
            if self.first_sample_at is None:
                self.first_sample_at = now
        self.arrivals.note(start, start + len(samples), now)

    def _finish(self) -> None:
        """At the end of the input: wait for ffmpeg and keep its complaint, unless close() stopped it."""
        if self._proc is not None:
            code = self._proc.wait()
            if code != 0 and not self._stop.is_set() and self._error is None:
                reason = first_stderr_line(self._stderr) or f"ffmpeg exited with status {code}"
                self._error = f"{self.name}: {reason}"
        if not self._stop.is_set():
            self._ended.set()

    # ------------------------------------------------------------------ taking
    def take(self, n: int) -> np.ndarray:
        """Up to `n` buffered samples, float32 [<= n] in [-1, 1), without waiting (empty when none are buffered)."""
        with self._lock:
            out = take_chunks(self._chunks, n)
            self._available -= len(out)
            self.taken += len(out)
        return out

    def available(self) -> int:
        """Samples buffered now."""
        with self._lock:
            return self._available

    @property
    def ended(self) -> bool:
        """The source reached its end (or failed: see `error`); what is buffered can still be taken."""
        return self._ended.is_set()

    @property
    def error(self) -> str | None:
        """One line saying why the source failed (set when `ended` turns True), else None."""
        return self._error if self._ended.is_set() else None

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Stop ffmpeg and the reader thread and release the descriptors (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._thread is not None:
            self._thread.join()
        if self._proc is not None:
            self._proc.stdout.close()
            self._proc.wait()
        elif self._read_fd is not None:
            os.close(self._read_fd)
        if self._stderr is not None:
            self._stderr.close()

    def __enter__(self) -> AudioSource:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def source_file(spec: str) -> Path | None:
    """The file (or named pipe) a source spec names; None for stdin (`-`) and a URL."""
    return None if spec == "-" or not spec.strip() or _URL.match(spec) else Path(spec)


def open_source(spec: str, *, stdin_fd: int | None = None) -> AudioSource:
    """The source `spec` names, checked (not started): a file path, `-` (s16le 16 kHz mono on stdin, or on `stdin_fd`),
    a named pipe (read as stdin is), or a URL. InputError for a missing, unreadable or undecodable file; UsageError
    for an unknown URL scheme."""
    if not spec.strip():
        raise UsageError(f"the speech source is empty; give one of: {'; '.join(SOURCE_KINDS)}")
    if spec == "-":
        return AudioSource("stdin", fd=sys.stdin.buffer.fileno() if stdin_fd is None else stdin_fd)
    url = _URL.match(spec)
    if url:
        if url.group(1).lower() not in URL_SCHEMES:
            raise UsageError(f"{spec}: speech cannot be read from a {url.group(1)}:// URL; give one of: "
                             f"{'; '.join(SOURCE_KINDS)}")
        return AudioSource(spec, command=[*_LIVE_PROBE, "-i", spec, *_DECODE])
    check_path_text(spec, "the speech source")
    path = Path(spec)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise unreadable(path, e, "; ".join(SOURCE_KINDS)) from None
    if stat.S_ISFIFO(mode):
        if not os.access(path, os.R_OK):
            raise InputError(f"{path}: cannot read the named pipe (permission denied); check its permissions")
        return AudioSource(spec, fifo=path)
    what = SOURCE_KINDS[0]
    check_input_file(path, what)
    target = f"file:{path.resolve()}"               # file: so that a name like "concat:x" is not a protocol
    if not any(": Audio: " in line for line in stream_lines(target)):
        raise InputError(f"{path}: ffmpeg finds no audio it can decode in the file; give {what}")
    return AudioSource(spec, command=[*_PACED, "-i", target, *_DECODE])
