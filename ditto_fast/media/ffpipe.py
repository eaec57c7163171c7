"""ffmpeg child processes whose raw video output is read straight into caller-owned frame buffers."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import tempfile
from typing import IO

import imageio_ffmpeg
import numpy as np

F_SETPIPE_SZ = 1031        # fcntl command (Linux): resize a pipe
# ffmpeg runs in a session of its own, so that a terminal's Ctrl-C reaches only us (we stop it, cleanly); an
# engine process (ditto_fast/handles/child.py), which ignores Ctrl-C and which its parent kills as a process group,
# turns this off so that its ffmpegs die with it (none finishing a file the engine no longer owns)
FFMPEG_OWN_SESSION = True


def own_session() -> bool:
    """Whether ffmpeg processes start in a session of their own (see FFMPEG_OWN_SESSION)."""
    return FFMPEG_OWN_SESSION
PIPE_BYTES = 1 << 20       # 1 MiB pipe: a 1080p RGB frame arrives in ~6 reads instead of ~95


def widen_pipe(fd: int) -> None:
    """Give the pipe `fd` PIPE_BYTES of buffer where Linux allows (else it keeps its 64 KiB: more, shorter I/O)."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass


def _describe(path: str | os.PathLike) -> list[str]:
    """ffmpeg's description of a media file (what `ffmpeg -i FILE` prints), as lines."""
    res = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", str(path)],
                         capture_output=True, text=True, errors="replace")
    return res.stderr.splitlines()


def stream_lines(path: str | os.PathLike) -> list[str]:
    """ffmpeg's one-line description of each stream of `path` ("Stream #0:0...: Video: h264 ..."); [] if unreadable."""
    return [ln for ln in _describe(path) if re.search(r"Stream #\S+: \w+: ", ln)]


def video_stream_line(path: str | os.PathLike) -> str | None:
    """ffmpeg's one-line description of the first video stream of `path` ("Stream #0:0...: Video: h264 ..."), or None."""
    return next((ln for ln in _describe(path) if re.search(r"Stream #.*: Video: ", ln)), None)


# colorspace tags as ffmpeg prints them in a stream description
_COLORSPACES = frozenset({"bt709", "bt470bg", "smpte170m", "bt2020nc", "bt2020c", "smpte240m", "fcc", "gbr",
                          "ycgco", "ycgco-re", "ycgco-ro", "chroma-derived-nc", "chroma-derived-c", "ictcp",
                          "ipt-c2"})


def pixel_format(line: str) -> str | None:
    """The pixel format in ffmpeg's description of a video stream ("yuv422p10le", "yuv420p", ...), or None."""
    m = re.search(r"Video: [^,]+(?:\([^)]*\))*, ([\w-]+)", line)
    return m.group(1) if m else None


def colorspace_tag(line: str) -> str | None:
    """The colorspace tag in ffmpeg's description of a video stream ("bt709", "bt470bg", ...), or None."""
    # e.g. "Stream #0:0[0x1](und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(tv, bt709/unknown/unknown,
    # progressive), 1920x1080 [SAR 1:1 DAR 16:9], ..."
    m = re.search(r"Video: [^,]+(?:\([^)]*\))*, [\w-]+\(([^)]*)\)", line)
    for part in (t.strip() for t in m.group(1).split(",")) if m else ():
        tag = part.split("/")[0]
        if tag in _COLORSPACES:
            return tag
    return None


def container_comment(path: str | os.PathLike) -> str | None:
    """The container-level comment tag of a media file, or None."""
    for ln in _describe(path):
        m = re.match(r"^ {4}comment\s*: (.*)$", ln, re.IGNORECASE) or \
            re.match(r"^ {4}product_version\s*: (ditto-fast .*)$", ln)     # Matroska writes COMMENT; MXF (see writer)
        if m:
            return m.group(1).strip()
    return None


def last_stderr_line(stderr_file: IO[bytes]) -> str:
    """The last non-empty line ffmpeg wrote to `stderr_file`, without its "[... @ 0x...] " context prefix."""
    try:
        stderr_file.seek(0)
        lines = [ln.strip() for ln in stderr_file.read().decode("utf-8", "replace").splitlines()]
    except (OSError, ValueError):
        return ""
    lines = [ln for ln in lines if ln]
    return re.sub(r"^\[[^\]]*@ 0x[0-9a-fA-F]+\]\s*", "", lines[-1]) if lines else ""


def first_stderr_line(stderr_file: IO[bytes]) -> str:
    """The first non-empty line ffmpeg wrote to `stderr_file` (at -loglevel error: the cause, where the last line is
    ffmpeg's summary "Error opening input files: ..."), without its "[... @ 0x...] " context prefix."""
    try:
        stderr_file.seek(0)
        text = stderr_file.read(1 << 16).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return re.sub(r"^\[[^\]]*@ 0x[0-9a-fA-F]+\]\s*", "", line)


class FinishedOnExit:
    """An ffmpeg writer as a `with` block: `close()` (finish the file) when the block ends normally, `abort()` (leave
    nothing half-written) when it raises."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class TruncatedFrame(EOFError):
    """The stream ended part-way through a frame."""


class RawVideoPipe:
    """One ffmpeg process (own session, stderr to a file) writing raw frames to its stdout: a pipe read with
    `read_into`, or `into`, a file of the caller's (ffmpeg writes from its current offset, in the background).

    `args` are ffmpeg's arguments after the global options; one output must be `pipe:1`.
    """

    def __init__(self, args: list[str], into: IO[bytes] | None = None) -> None:
        cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", *args]
        self._stderr = tempfile.TemporaryFile()   # a file, not a pipe: ffmpeg can never block on it
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if into is None else into,
                                      stderr=self._stderr, start_new_session=own_session(), bufsize=0)
        if into is None:
            widen_pipe(self._proc.stdout.fileno())

    def read_into(self, buf: np.ndarray) -> bool:
        """Fill the contiguous array `buf` with the next frame; False at a clean end of stream.

        Raises TruncatedFrame when the stream stops mid-frame.
        """
        view = memoryview(buf).cast("B")
        got, size = 0, len(view)
        read = self._proc.stdout.readinto
        while got < size:
            n = read(view[got:])
            if not n:
                if got:
                    raise TruncatedFrame(f"stream ended after {got} of {size} bytes of a frame")
                return False
            got += n
        return True

    def wait(self) -> tuple[int, str]:
        """Wait for ffmpeg to exit (all its outputs complete); returns (exit code, last stderr line)."""
        code = self._proc.wait()
        return code, self.last_error()

    def last_error(self) -> str:
        """ffmpeg's last stderr line, shortened (empty if none)."""
        return last_stderr_line(self._stderr)[:160]

    def stderr_text(self, limit: int = 1 << 16) -> str:
        """The last `limit` bytes ffmpeg wrote to stderr, as text (empty if none or closed)."""
        try:
            self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, self._stderr.tell() - limit))
            return self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        """Stop ffmpeg if it is still running and release the pipe and the stderr file."""
        if self._proc.poll() is None:
            self._proc.kill()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._proc.wait()
        self._stderr.close()
