"""A live stream out: one ffmpeg encoding the rendered frames and the same speech, muxed to a .ts file, HLS, UDP, SRT
or RTMP as they come."""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import imageio_ffmpeg
import numpy as np

from ditto_fast.core.errors import DittoError, InputError, UsageError
from ditto_fast.encoding.writer import check_output_path
from ditto_fast.media.ffpipe import FinishedOnExit, first_stderr_line, own_session, widen_pipe
from ditto_fast.media.outputs import overwrites
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE, rate_text
from ditto_fast.media.yuv import LAYOUTS, Layout

# destination kinds, as logs name them, and how each is written
KINDS = {"ts file": "a path ending .ts", "hls": "a path ending .m3u8 (HLS)", "udp": "udp://HOST:PORT",
         "srt": "srt://HOST:PORT (caller; ?mode=listener to wait for one)", "rtmp": "rtmp://HOST/APP/KEY"}
PIX_FMTS = ("rgb24", *LAYOUTS)
# the mono speech on both channels at its own level (ffmpeg's own mono-to-stereo mix would lower it by 3 dB)
AUDIO_OUT = ["-af", "pan=stereo|c0=c0|c1=c0", "-c:a", "aac", "-b:a", "128k", "-ar", "48000"]
HLS_SECONDS = 1
QUEUED_FRAMES = 8           # frames (and their audio) waiting for ffmpeg before write() waits
PUT_WAIT_S = 0.1            # how often a waiting write() looks whether ffmpeg is still there
SRT_LINGER_S = 2            # at close, SRT waits at most this long for the receiver to take what was sent
CLOSE_TIMEOUT_S = 30.0      # close() waits this long for ffmpeg to finish, then kills it
REACH_TIMEOUT_S = 3.0       # an RTMP server's TCP connection is awaited this long before anything loads
FILE_FIX = "check free disk space and that the folder is still writable"
NETWORK_FIX = "check that the receiver is up and reachable"


def _kinds_text() -> str:
    return "; ".join(KINDS.values())


def describe_destination(dest: str) -> str:
    """The kind of `dest` for logs ("ts file", "hls", "udp", "srt", "rtmp"); UsageError listing the kinds if none."""
    scheme = urlsplit(dest).scheme.lower() if "://" in dest else ""
    if scheme in ("udp", "srt"):
        return scheme
    if scheme in ("rtmp", "rtmps"):
        return "rtmp"
    if not scheme:
        suffix = Path(dest).suffix.lower()
        if suffix == ".ts":
            return "ts file"
        if suffix == ".m3u8":
            return "hls"
    raise UsageError(f"{dest}: not a stream destination; give one of: {_kinds_text()}")


def check_destination(dest: str) -> str:
    """UsageError (one line) unless ffmpeg can be started on `dest`: a URL has a host (and a port for udp and srt);
    InputError where a file's folder is missing or not writable, or a folder is named; starts nothing. Returns the
    kind (describe_destination)."""
    kind = describe_destination(dest)
    if kind in ("ts file", "hls"):              # a folder missing or not writable: InputError (exit 3), as for render
        check_output_path(dest, example="live" + Path(dest).suffix.lower())
        return kind
    url = urlsplit(dest)
    try:
        port = url.port
    except ValueError:
        raise UsageError(f"{dest}: the port is not a number from 0 to 65535; give {KINDS[kind]}") from None
    if not url.hostname or (kind != "rtmp" and port is None):
        raise UsageError(f"{dest}: a {kind} destination needs a host{'' if kind == 'rtmp' else ' and a port'}; "
                         f"give {KINDS[kind]}")
    if kind == "rtmp" and url.path.strip("/") == "":
        raise UsageError(f"{dest}: an RTMP destination needs the application and stream key; give {KINDS[kind]}")
    mode = parse_qs(url.query).get("mode", ["caller"])[-1]
    if kind == "srt" and mode not in ("caller", "listener", "rendezvous"):
        raise UsageError(f"{dest}: SRT mode {mode!r} is not caller, listener or rendezvous; give {KINDS[kind]}")
    return kind


def check_reachable(dest: str, timeout: float = REACH_TIMEOUT_S) -> None:
    """Before anything loads: InputError (one line) where a network destination cannot be reached, as far as can be
    told without streaming: an RTMP server that takes no TCP connection, an SRT or UDP host that does not resolve.
    (An SRT caller whose host resolves but where nobody listens fails once it streams: only SRT's handshake tells.)"""
    kind = describe_destination(dest)
    if kind in ("ts file", "hls"):
        return
    url = urlsplit(dest)
    host, port = url.hostname, url.port
    try:
        if kind == "rtmp":
            port = port or (443 if url.scheme.lower() == "rtmps" else 1935)
            socket.create_connection((host, port), timeout=timeout).close()
        else:
            socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        what = f"cannot connect to {host}:{port}" if kind == "rtmp" else f"the host {host} is not known"
        raise InputError(f"{dest}: {what} ({reason}); {NETWORK_FIX}") from None


def _segment_name(playlist: Path) -> re.Pattern:
    """The names of an HLS playlist's segments beside it (NAME_00000.ts, as _muxer_args writes them)."""
    return re.compile(re.escape(playlist.stem) + r"_\d{5,}\.ts")


def stream_files(dest: str) -> list[Path]:
    """The files a stream to `dest` writes that are there now: a .ts file, or an HLS playlist and its segments;
    none for a URL."""
    kind = describe_destination(dest)
    out = Path(dest)
    if kind not in ("ts file", "hls"):
        return []
    found = [out] if os.path.lexists(out) else []
    if kind == "hls" and out.parent.is_dir():
        pattern = _segment_name(out)
        found += sorted(p for p in out.parent.iterdir() if pattern.fullmatch(p.name))
    return found


def written_by_stream(dest: str, path: str | os.PathLike) -> bool:
    """Whether a stream to `dest` would write over `path` (there or not): the .ts file or HLS playlist itself, one of
    the playlist's segments, or the same file reached through a symbolic or hard link (ffmpeg writes in place)."""
    kind = describe_destination(dest)
    if kind not in ("ts file", "hls"):
        return False
    out, other = Path(dest), Path(path)
    if out.resolve() == other.resolve() or overwrites(out, other):
        return True
    try:
        if out.exists() and other.exists() and os.path.samefile(out, other):
            return True
    except OSError:
        pass
    return kind == "hls" and other.resolve().parent == out.resolve().parent and \
        _segment_name(out).fullmatch(other.resolve().name) is not None


def _muxer_args(dest: str, kind: str) -> list[str]:
    """ffmpeg's output options and output for `dest` of `kind`."""
    if kind == "ts file":
        return ["-f", "mpegts", f"file:{Path(dest).resolve()}"]
    if kind == "hls":
        # an unbounded playlist (an event: segments only added), each ~HLS_SECONDS, beside it as NAME_00000.ts
        out = Path(dest).resolve()
        segments = out.with_name(out.stem.replace("%", "%%") + "_%05d.ts")
        return ["-f", "hls", "-hls_time", str(HLS_SECONDS), "-hls_list_size", "0", "-hls_playlist_type", "event",
                "-hls_flags", "independent_segments", "-hls_segment_filename", str(segments), str(out)]
    if kind == "udp":                                   # 7 TS packets: one datagram under any usual MTU
        return ["-f", "mpegts", _with_default(dest, "pkt_size", "1316")]
    if kind == "srt":                                   # SRT's live mode drops what is unsent at close: the last
        return ["-f", "mpegts", _with_default(dest, "linger", str(SRT_LINGER_S))]     # half second of speech
    return ["-flvflags", "no_duration_filesize", "-f", "flv", dest]


def _with_default(url: str, key: str, value: str) -> str:
    """`url` with the query parameter `key`=`value` added unless it has one."""
    parts = urlsplit(url)
    if key in parse_qs(parts.query):
        return url
    return parts._replace(query="&".join(q for q in (parts.query, f"{key}={value}") if q)).geturl()


def _video_args(encoder: str, crf: int, preset: str, gop: int) -> list[str]:
    """Low-latency H.264: no B-frames, a key frame every `gop` frames (fixed, for HLS segments), yuv420p."""
    args = ["-c:v", encoder, "-g", str(gop), "-keyint_min", str(gop), "-bf", "0", "-pix_fmt", "yuv420p"]
    if encoder == "libx264":
        args += ["-preset", preset, "-tune", "zerolatency", "-crf", str(crf), "-sc_threshold", "0"]
    return args


class _Feeder:
    """One ffmpeg input pipe written by a thread of its own from a bounded queue: ffmpeg may be blocked reading its
    other input while this one is full. The thread ends at the None put last, or when the pipe breaks."""

    def __init__(self, fd: int, name: str, size: int) -> None:
        self.error: OSError | None = None
        self._fd = fd
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=size)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (data := self._queue.get()) is not None:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
        except OSError as e:                        # EPIPE: ffmpeg is gone
            self.error = e
        finally:
            os.close(self._fd)

    def put(self, data: bytes | None, gone: Callable[[], bool]) -> bool:
        """Queue `data` (None: close the pipe once the rest is written), waiting while the queue is full; False if
        the thread has ended or `gone()` turns True meanwhile."""
        while self._thread.is_alive():
            try:
                self._queue.put(data, timeout=PUT_WAIT_S)
                return True
            except queue.Full:
                if gone():
                    return False
        return False

    def end(self, timeout: float) -> None:
        """Close the pipe after what is queued (ffmpeg gone: at once) and wait up to `timeout` for the thread."""
        self.put(None, lambda: True)
        self._thread.join(timeout)


class StreamOutput(FinishedOnExit):
    """One ffmpeg process: raw frames (`pix_fmt`: rgb24 or planes as yuv.Layout gives them) at `rate` on stdin and
    s16le mono audio at `audio_sample_rate` on a second pipe, encoded as low-latency H.264 (x264 zerolatency, no
    B-frames, a key frame every `gop_seconds`) and AAC 48 kHz stereo (the mono speech upsampled and doubled), muxed
    to `dest` as it comes.

    Timestamps come from the frame and sample counts (ffmpeg's rawvideo and s16le inputs), so picture and audio are
    in sync by construction. Each input is written by a thread of its own from a bounded queue; write() waits while
    ffmpeg cannot keep up (a slow network; an SRT listener until its caller comes) and raises InputError naming
    `dest` once ffmpeg is gone (a refused or lost connection, a full disk).
    """

    def __init__(self, dest: str, size: tuple[int, int], rate: Fraction, pix_fmt: str, *, crf: int = 23,
                 preset: str = "veryfast", gop_seconds: float = 1.0, encoder: str = "libx264",
                 audio_sample_rate: int = SPEECH_SAMPLE_RATE) -> None:
        self.dest = dest
        self.kind = check_destination(dest)
        if pix_fmt not in PIX_FMTS:
            raise ValueError(f"pix_fmt must be one of {', '.join(PIX_FMTS)}, got {pix_fmt}")
        width, height = int(size[0]), int(size[1])
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            raise ValueError(f"frame size must be positive and even for yuv420p, got {width}x{height}")
        self.rate = Fraction(rate).limit_denominator(1001) if isinstance(rate, float) else Fraction(rate)
        self.size, self.pix_fmt = (width, height), pix_fmt
        self.frame_bytes = _frame_bytes(pix_fmt, width, height)
        self.gop = max(1, round(gop_seconds * self.rate))
        self.frames_written = 0
        self.samples_written = 0
        self._closed = False
        audio_read, audio_write = os.pipe()         # ffmpeg reads it as pipe:N (pass_fds keeps the number)
        self.command = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-y",
                        "-f", "rawvideo", "-pix_fmt", pix_fmt, "-s", f"{width}x{height}",
                        "-framerate", rate_text(self.rate), "-i", "pipe:0",
                        "-f", "s16le", "-ar", str(int(audio_sample_rate)), "-ac", "1", "-i", f"pipe:{audio_read}",
                        "-map", "0:v:0", "-map", "1:a:0", *_video_args(encoder, crf, preset, self.gop), *AUDIO_OUT,
                        "-flush_packets", "1", "-muxdelay", "0", "-muxpreload", "0", *_muxer_args(dest, self.kind)]
        self._stderr = tempfile.TemporaryFile()    # a file, not a pipe: ffmpeg can never block on it
        try:
            self._proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=self._stderr, start_new_session=own_session(), pass_fds=(audio_read,))
        except OSError as exc:
            os.close(audio_write)
            self._stderr.close()
            raise DittoError(f"streaming to {dest} failed: cannot start ffmpeg ({exc}); reinstall imageio-ffmpeg") \
                from None
        finally:
            os.close(audio_read)
        video_write = os.dup(self._proc.stdin.fileno())
        self._proc.stdin.close()
        widen_pipe(video_write)
        widen_pipe(audio_write)
        self._video = _Feeder(video_write, f"video to {dest}", QUEUED_FRAMES)
        self._audio = _Feeder(audio_write, f"audio to {dest}", QUEUED_FRAMES)

    @property
    def pid(self) -> int:
        """ffmpeg's process id (for logs)."""
        return self._proc.pid

    def _gone(self) -> bool:
        return self._proc.poll() is not None

    def alive(self) -> bool:
        """ffmpeg is running and both pipes take what is written."""
        return not self._closed and not self._gone() and self._video.error is None and self._audio.error is None

    def write(self, frame: np.ndarray, audio: np.ndarray) -> None:
        """Send one frame (any contiguous array whose bytes are the frame in `pix_fmt`) and the int16 mono samples
        that go with its duration (float samples in [-1, 1] are converted)."""
        if self._closed:
            raise ValueError("write() on a closed StreamOutput")
        if frame.nbytes != self.frame_bytes:
            raise ValueError(f"a {self.pix_fmt} frame of {self.size[0]}x{self.size[1]} is {self.frame_bytes} bytes, "
                             f"got {frame.dtype} {frame.shape} ({frame.nbytes} bytes)")
        pcm = _pcm_bytes(audio)
        if not self.alive():
            self._fail()
        sent = self._video.put(np.ascontiguousarray(frame).tobytes(), self._gone) and \
            (not pcm or self._audio.put(pcm, self._gone))
        if not sent:
            self._fail()
        self.frames_written += 1
        self.samples_written += len(pcm) // 2

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Close both inputs and wait up to `timeout` s for ffmpeg to finish the stream (a file is then complete and
        playable); InputError with ffmpeg's complaint if it failed (idempotent)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        for feeder in (self._video, self._audio):       # a receiver that takes nothing must not hold us forever
            feeder.put(None, lambda: self._gone() or time.monotonic() > deadline)
        try:
            code = self._proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._release()
            raise InputError(f"streaming to {self.dest} ({self.kind}) failed: ffmpeg had not finished {timeout:g} s "
                             f"after the end; {self._fix()}") from None
        if code != 0 or self._video.error or self._audio.error:
            self._fail()
        self._release()

    def abort(self) -> None:
        """Kill ffmpeg at once: what it wrote stays, a file without its end (idempotent)."""
        self._closed = True
        self._release()

    def _release(self) -> None:
        """Kill ffmpeg if it still runs, end the feeder threads, close the stderr file."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for feeder in (self._video, self._audio):
            feeder.end(timeout=5)
        self._stderr.close()

    def _fail(self) -> None:
        """ffmpeg stopped or failed: let it finish saying why, then raise that as one line naming the destination."""
        self._closed = True
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        reason = first_stderr_line(self._stderr) if not self._stderr.closed else ""
        broken = self._video.error or self._audio.error
        self._release()
        if not reason:
            reason = f"ffmpeg exited with status {code}" if code is not None else \
                f"ffmpeg stopped reading ({broken.strerror})" if broken else "ffmpeg stopped"
        raise InputError(f"streaming to {self.dest} ({self.kind}) failed: {reason}; {self._fix()}")

    def _fix(self) -> str:
        return FILE_FIX if self.kind in ("ts file", "hls") else NETWORK_FIX


def _frame_bytes(pix_fmt: str, width: int, height: int) -> int:
    """The bytes of one raw frame."""
    if pix_fmt == "rgb24":
        return width * height * 3
    layout = Layout(pix_fmt)
    rows, cols = layout.shape(width, height)
    return rows * cols * np.dtype(layout.dtype).itemsize


def _pcm_bytes(audio: np.ndarray) -> bytes:
    """int16 samples (float in [-1, 1] converted) as s16le bytes."""
    audio = np.asarray(audio)
    if audio.dtype.kind == "f":
        audio = (np.clip(audio, -1.0, 1.0) * 32767.0).round()
    elif audio.dtype != np.int16:
        raise ValueError(f"audio must be int16 (or float in [-1, 1]) samples, got {audio.dtype}")
    return audio.astype("<i2", copy=False).reshape(-1).tobytes()
