"""Speech arriving while it is spoken, as 16 kHz mono float32 samples that a reader thread buffers: a file decoded at
its own pace, raw PCM or a container on stdin or a named pipe (what a TTS engine writes), or a URL ffmpeg reads
live. What bytes hold is told in containers.py."""

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
from ditto_fast.live.containers import DECODE, LIVE_PROBE, READ_BYTES, SpeechBytes, s16le
from ditto_fast.media.inputs import check_input_file
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE

URL_SCHEMES = ("srt", "udp", "rtmp", "http", "https", "rtp", "tcp")
SOURCE_KINDS = ("an audio file (wav, mp3, flac, m4a, ...)",
                "- (stdin: s16le 16 kHz mono, or a WAV, MP3, FLAC, Ogg, MPEG-TS, ... stream)",
                "a named pipe carrying the same", "a URL (" + ", ".join(f"{s}://" for s in URL_SCHEMES) + ")")
ARRIVALS_KEPT = 8192        # reads whose arrival time is kept (a file's reads are ~23 ms apart: over 3 minutes)
POLL_S = 0.1                # how often a reader waiting for data looks whether it was closed
# a file at its own pace: -re with a 10 ms initial burst (ffmpeg's default burst is half a second, and 0 bursts too)
_PACED = ["-re", "-readrate_initial_burst", "0.01"]
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# URLs whose bytes ffmpeg fetches as they come (-f data), for them to be told apart here (containers.SpeechBytes): a
# WAV is read here, not by ffmpeg's WAV reader, which holds the first 64 KiB of 16-bit PCM back (4 s at 8 kHz, for
# ever for a shorter utterance on a feed that stays open) to look for S/PDIF in it
BYTE_SCHEMES = ("http", "https", "tcp", "udp", "srt")
# http(s): a container other than a WAV is read from the URL again by ffmpeg itself (an MP4 needs to seek)
REREAD_SCHEMES = ("http", "https")
STALL_S = 10.0              # with --stop-at-end, a URL that gives nothing for this long has ended (an error)
PROBE_TIMEOUT_S = 5.0       # an http(s) source's answer is awaited this long before anything loads


def _fetch(url: str) -> list[str]:
    """ffmpeg's arguments that write `url`'s bytes to stdout as they come."""
    return ["-probesize", "32", "-analyzeduration", "0", "-f", "data", "-i", url, "-map", "0:0", "-c", "copy",
            "-flush_packets", "1", "-f", "data", "pipe:1"]


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
    """Samples read by a thread and buffered until taken, from one of: ffmpeg's decoded output (`command`: ffmpeg's
    arguments after the global ones, giving s16le 16 kHz mono), a URL's bytes as ffmpeg fetches them (`fetch`, the
    same; `direct`: the command that decodes the URL itself, for a container that is better read from the URL than
    from a pipe), a file descriptor (`fd`, duplicated: the caller's stays open) or a named pipe (`fifo`; with
    `reopen`, opened again when its writer closes, so that the next writer is heard). Bytes (all but `command`'s) go
    through containers.SpeechBytes: raw s16le PCM (from `fd` and `fifo` only), a WAV, another container, or noise,
    refused. `stall_s`: a source from which nothing came for that long has ended, with an error.

    `ended` turns True when no more samples will come (end of file or stream, ffmpeg exited); `error` then holds a
    one-line reason if the source failed. `name` is the spec, for messages.
    """

    def __init__(self, name: str, *, command: list[str] | None = None, fetch: list[str] | None = None,
                 direct: list[str] | None = None, fd: int | None = None, fifo: Path | None = None,
                 reopen: bool = False, stall_s: float | None = None) -> None:
        if (command is None) + (fetch is None) + (fd is None) + (fifo is None) != 3:
            raise ValueError("give exactly one of command, fetch, fd, fifo")
        self.name = name
        self.sample_rate = SPEECH_SAMPLE_RATE
        self.arrivals = Arrivals()
        self.first_sample_at: float | None = None
        self.received = 0               # samples that have arrived since start()
        self.taken = 0                  # samples take() has returned: the stream index of the next one
        self._command, self._fetch, self._direct = command, fetch, direct
        self._fd, self._fifo, self._reopen, self._stall_s = fd, fifo, reopen, stall_s
        self._bytes = None if command is not None else \
            SpeechBytes(name, self._deliver, raw=fetch is None, decode=direct is None)
        self._half = b""                # an odd byte: the first half of the next read's first sample
        self._chunks: deque[np.ndarray] = deque()
        self._available = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._procs = threading.Lock()  # close() and a handover: no ffmpeg starts after close() stopped the last
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
        if self._command is not None or self._fetch is not None:
            self._spawn(self._command if self._command is not None else self._fetch)
        elif self._fd is not None:
            self._read_fd = os.dup(self._fd)
        else:
            self._read_fd = self._open_fifo()
        self._thread = threading.Thread(target=self._run, name=f"source {self.name}", daemon=True)
        self._thread.start()
        return self

    def _spawn(self, args: list[str]) -> None:
        """Start ffmpeg with `args`; its output is what is read from now on."""
        if self._stderr is None:
            self._stderr = tempfile.TemporaryFile()
        self._stderr.seek(0)
        self._stderr.truncate()
        cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", *args]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr,
                                      start_new_session=own_session(), bufsize=0)
        widen_pipe(self._proc.stdout.fileno())
        self._read_fd = self._proc.stdout.fileno()

    def _open_fifo(self) -> int:
        """The named pipe opened to read (O_NONBLOCK: returns at once, and poll waits for a writer to come)."""
        try:
            return os.open(self._fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise unreadable(self._fifo, e, SOURCE_KINDS[2]) from None

    def _run(self) -> None:
        try:
            self._read()
        except InputError as e:         # the named pipe could not be opened again
            self._error = str(e)
        finally:
            self._finish()

    def _read(self) -> None:
        poller, polled = select.poll(), None
        last = time.monotonic()
        while not self._stop.is_set():
            if polled != self._read_fd:
                if polled is not None:
                    poller.unregister(polled)
                polled = self._read_fd
                poller.register(polled, select.POLLIN | select.POLLHUP | select.POLLERR)
            ready = poller.poll(POLL_S * 1000)
            now = time.monotonic()
            if not ready:
                if self._bytes is not None:
                    self._bytes.tick(now)
                    if self._taken_over():
                        continue
                if self._stall_s is not None and now - last > self._stall_s:
                    self._error = (f"{self.name}: nothing came for {self._stall_s:g} s; the source has stalled "
                                   "(--stop-at-end ends the stream)")
                    if self._proc is not None:
                        self._proc.kill()
                    return
                if self._bytes is not None and self._bytes.done:
                    return
                continue
            try:
                data = os.read(self._read_fd, READ_BYTES)
            except BlockingIOError:
                continue
            except OSError as e:
                self._error = f"{self.name}: reading failed ({e.strerror or e})"
                return
            if not data:
                if self._fifo is not None and self._reopen and self._bytes is not None:
                    self._bytes.end()                   # this writer's stream; the next writer is sniffed anew
                    os.close(self._read_fd)
                    self._read_fd = None
                    self._read_fd = self._open_fifo()
                    continue
                return
            last = now
            if self._bytes is None:
                self._deliver_pcm(data)
                continue
            self._bytes.feed(data, now)
            if self._taken_over():
                continue
            if self._bytes.done:
                return

    def _taken_over(self) -> bool:
        """A URL's bytes are a container that ffmpeg reads better from the URL itself: it does so from now on (the
        bytes read so far are read again)."""
        if self._bytes is None or self._bytes.handover is None:
            return False
        with self._procs:
            if self._stop.is_set():         # closed meanwhile: the reader ends
                return False
            self._bytes = None
            self._proc.kill()
            self._proc.wait()
            self._proc.stdout.close()
            self._spawn(self._direct)
        return True

    def _deliver_pcm(self, data: bytes) -> None:
        samples, self._half = s16le(self._half + data)
        self._deliver(samples)

    def _deliver(self, samples: np.ndarray) -> None:
        if not len(samples):
            return
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
        """At the end of the input: the bytes' last samples, then wait for ffmpeg and keep its complaint (the first
        cause: a fetch that failed before a decoder that had nothing), unless close() stopped it."""
        if self._bytes is not None and not self._stop.is_set():
            self._bytes.end()
        if self._proc is not None:
            code = self._proc.wait()
            if code != 0 and not self._stop.is_set() and self._error is None:
                reason = first_stderr_line(self._stderr) or f"ffmpeg exited with status {code}"
                self._error = f"{self.name}: {reason}"
        if self._bytes is not None and self._error is None:
            self._error = self._bytes.error
        if self._error is None and self.received == 0 and not self._stop.is_set():
            self._error = (f"{self.name}: ended before any speech came (an empty input); send speech: s16le 16 kHz "
                           "mono, or a container ffmpeg decodes")
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

    def take_band(self, n: int) -> None:
        """None: a source read at 16 kHz has no band of its own (the stream upsamples what the model hears)."""
        return None

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
        with self._procs:
            self._stop.set()
            speech_bytes = self._bytes
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
        if speech_bytes is not None:
            speech_bytes.close()
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


def check_source_url(spec: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Before anything loads: InputError (one line) when an http(s) source answers an error (404), cannot be reached
    or does not answer within `timeout`. Other URLs are not tried: a listener waits for its caller, and a server
    that takes one connection would have spent it."""
    url = _URL.match(spec)
    if not url or url.group(1).lower() not in REREAD_SCHEMES:
        return
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context()      # certificates unchecked, as ffmpeg reads https by default
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(urllib.request.Request(spec, headers={"User-Agent": "ditto-fast"}),
                                    timeout=timeout, context=context):
            pass
    except urllib.error.HTTPError as e:
        raise InputError(f"{spec}: the server answers {e.code} {e.reason}; check the URL") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise InputError(f"{spec}: cannot be read ({reason}); check the URL and that its server is up") from None


def open_source(spec: str, *, stdin_fd: int | None = None, stop_at_end: bool = False) -> AudioSource:
    """The source `spec` names, checked (not started): a file path, `-` (stdin, or `stdin_fd`: s16le 16 kHz mono or a
    container, see containers.py), a named pipe (read as stdin is; opened again for its next writer, except with
    `stop_at_end`, where its first writer's end is the end), or a URL (with `stop_at_end`, one that gives nothing
    for STALL_S has ended). InputError for a missing, unreadable or undecodable file; UsageError for an unknown URL
    scheme."""
    if not spec.strip():
        raise UsageError(f"the speech source is empty; give one of: {'; '.join(SOURCE_KINDS)}")
    if spec == "-":
        return AudioSource("stdin", fd=sys.stdin.buffer.fileno() if stdin_fd is None else stdin_fd)
    url = _URL.match(spec)
    if url:
        scheme = url.group(1).lower()
        if scheme not in URL_SCHEMES:
            raise UsageError(f"{spec}: speech cannot be read from a {url.group(1)}:// URL; give one of: "
                             f"{'; '.join(SOURCE_KINDS)}")
        stall = STALL_S if stop_at_end else None
        direct = [*LIVE_PROBE, "-i", spec, *DECODE]
        if scheme in BYTE_SCHEMES:
            return AudioSource(spec, fetch=_fetch(spec), direct=direct if scheme in REREAD_SCHEMES else None,
                               stall_s=stall)
        return AudioSource(spec, command=direct, stall_s=stall)
    check_path_text(spec, "the speech source")
    path = Path(spec)
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise unreadable(path, e, "; ".join(SOURCE_KINDS)) from None
    if stat.S_ISFIFO(mode):
        if not os.access(path, os.R_OK):
            raise InputError(f"{path}: cannot read the named pipe (permission denied); check its permissions")
        return AudioSource(spec, fifo=path, reopen=not stop_at_end)
    what = SOURCE_KINDS[0]
    check_input_file(path, what)
    target = f"file:{path.resolve()}"               # file: so that a name like "concat:x" is not a protocol
    if not any(": Audio: " in line for line in stream_lines(target)):
        raise InputError(f"{path}: ffmpeg finds no audio it can decode in the file; give {what}")
    return AudioSource(spec, command=[*_PACED, "-i", target, *DECODE])
