"""Stream RGB or planar YUV frames into a video file (MP4, QuickTime or Matroska, with the speech muxed in) that
appears at its path only when complete, with the process's usual file mode."""

from __future__ import annotations

import os
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import imageio_ffmpeg
import numpy as np

from ditto_fast.audio.decode import audio_layout
from ditto_fast.core.errors import DittoError, InputError, UsageError
from ditto_fast.media.ffpipe import FinishedOnExit, last_stderr_line, own_session, widen_pipe
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.core.files import check_path_length
from ditto_fast.media.partfiles import create_locked, signals_held
from ditto_fast.media.rates import rate_text
from ditto_fast.media.yuv import LAYOUTS, Layout
from ditto_fast.encoding.formats import OutputFormat, output_format
from ditto_fast.encoding.soundtrack import Soundtrack, plan_soundtrack

SOFTWARE_THREADED = ("libx264", "libx265")     # the encoders whose threads `threads` sets


def check_output_path(path: str | os.PathLike, example: str = "out.mp4") -> Path:
    """Raise InputError unless a file can be created at `path` (UsageError for a name that starts with a dot);
    call it before any heavy work. `example`: the name a folder given instead is told to add (report.json ...)."""
    out = Path(path)
    check_path_length(out)
    if out.is_dir():
        raise InputError(f"{out}: is a directory; give a file name such as {out / example}")
    if out.name.startswith("."):        # only an extension (.mp4, ..mp4) or hidden: looks like our temporaries
        rest = out.name.lstrip(".")
        better = out.with_name(rest if "." in rest else f"news.{rest}" if rest else "news.mp4")
        raise UsageError(f"{out}: the output name starts with a dot (a hidden file, or only an extension); "
                         f"give a name such as {better}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        raise InputError(f"{out}: directory {parent} does not exist; create it or choose another output path")
    if not parent.is_dir():
        raise InputError(f"{out}: {parent} is not a directory; choose another output path")
    try:  # a real probe also catches read-only file systems and root-squashed mounts
        with signals_held():            # made and removed before a Ctrl-C can leave it behind
            probe, fd = create_locked(out, "probe")
            os.unlink(probe)
            os.close(fd)
    except OSError as exc:
        raise InputError(f"{out}: cannot write in {parent} ({exc.strerror}); choose another output path") from None
    return out


def _spawn(cmd: list[str], stderr_file, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start ffmpeg reading frames on stdin; its own session so a terminal Ctrl-C reaches only us (but in an engine
    process: media/ffpipe.own_session). `pass_fds` stay open in ffmpeg (the temporary file's lock: held while
    ffmpeg still writes, even if we were killed)."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr_file,
                            start_new_session=own_session(), pass_fds=pass_fds)
    widen_pipe(proc.stdin.fileno())
    return proc


class VideoWriter(FinishedOnExit):
    """Video writer fed one frame at a time (RGB, or planar YUV already in BT.709 TV range in one of yuv.LAYOUTS:
    `pix_fmt`), audio muxed by the same ffmpeg process.

    The container comes from the output's extension and the codec from `fmt` (see encoding/formats.py;
    default: H.264 in the container the name says). Output duration: the video has exactly the frames
    written; with audio, the number of `frames` to come must be given and the audio is cut or padded to
    exactly their length (the same bytes every run; ffmpeg's -shortest, used before, overshot by up to a
    quarter of a second on a loaded machine).
    `fps` is exact as a Fraction (30000/1001 is written as such in the stream).
    `comment` goes into the container's comment tag (batch records what a file was made from there).
    `soundtrack` says what the audio carries (see encoding/soundtrack.py); without it the writer plans it from the
    audio file's channels before starting, so a file it cannot carry is refused before the first frame.
    The file is written to a hidden temporary name beside `out_path` (flock'd while being written) and renamed
    into place by `close()`; `abort()` (also called when an exception leaves the `with` block) removes it. A
    writer first removes the temporaries of dead writers (killed with SIGKILL, say) in its folder.
    A delivery's format (`fmt`) takes the profile's encoder, size, scan and audio track layout; `check` is called on the
    finished temporary file before the rename (QC: an exception leaves nothing at `out_path`), its result kept in
    `checked`.
    `threads`: x264's or x265's threads (None: the encoder's own choice, 1.5 a core; x264's bytes follow the count,
    so a count given makes the same bytes on every host); other encoders choose their own.
    """

    def __init__(self, out_path: str | os.PathLike, size: tuple[int, int], fps: Fraction | float = 25,
                 audio_path: str | os.PathLike | None = None, crf: int = 18, preset: str = "veryfast",
                 *, soundtrack: Soundtrack | None = None, comment: str | None = None, frames: int | None = None,
                 fmt: OutputFormat | None = None, pix_fmt: str = "rgb24",
                 check: Callable[[Path], Any] | None = None, threads: int | None = None):
        if pix_fmt != "rgb24" and pix_fmt not in LAYOUTS:
            raise ValueError(f"pix_fmt must be rgb24 or one of {', '.join(LAYOUTS)}, got {pix_fmt}")
        self.pix_fmt = pix_fmt
        self._layout = None if pix_fmt == "rgb24" else Layout(pix_fmt)
        self.out_path = check_output_path(out_path)
        self.format = fmt or output_format(self.out_path)
        width, height = int(size[0]), int(size[1])
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            raise ValueError(f"frame size must be positive and even for yuv420p, got {width}x{height}")
        if audio_path is not None and not Path(audio_path).is_file():
            raise InputError(f"{audio_path}: audio file not found; pass an existing WAV/MP3/... file")
        if audio_path is not None and frames is None:
            raise ValueError("with audio_path, give frames= (the number of frames to come): the audio is cut or "
                             "padded to exactly their length")
        if audio_path is not None and soundtrack is None:
            soundtrack = plan_soundtrack(audio_path, *audio_layout(audio_path), self.format)
        self.soundtrack = soundtrack
        self.size = (width, height)
        self.fps = Fraction(fps).limit_denominator(1001) if isinstance(fps, float) else Fraction(fps)
        self.frames_written = 0
        self._check, self.checked = check, None
        self.threads = threads
        self._tmp_path, self._lock_fd = None, None
        try:
            with signals_held():        # a Ctrl-C as the file appears comes once it is named here: removed below
                self._tmp_path, self._lock_fd = create_locked(self.out_path, "part", self.out_path.suffix)
            self._stderr = tempfile.TemporaryFile()   # a file, not a pipe: ffmpeg can never block on it
            self._done = False
            self._start(audio_path, crf, preset, comment, frames)
        except BaseException:                         # a failure or Ctrl-C while starting: nothing is left
            proc = getattr(self, "_proc", None)
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            self._done = True
            if self._tmp_path is not None:
                self._tmp_path.unlink(missing_ok=True)
            if hasattr(self, "_stderr"):
                self._stderr.close()
            self._unlock()
            raise

    def _start(self, audio_path: str | os.PathLike | None, crf: int, preset: str, comment: str | None,
               frames: int | None) -> None:
        """Start the ffmpeg process that encodes into the temporary file."""
        width, height = self.size
        fmt = self.format
        cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-y",
               "-f", "rawvideo", "-pix_fmt", self.pix_fmt, "-s", f"{width}x{height}", "-framerate", rate_text(self.fps),
               "-i", "pipe:0"]
        if audio_path is not None:
            cmd += ["-i", str(audio_path)]
        cmd += ["-map", "0:v:0", "-vf", fmt.video_filters(self.size, planes=self._layout is not None),
                *fmt.video_args(crf, preset)]
        if self.threads is not None and fmt.encoder in SOFTWARE_THREADED:
            cmd += ["-threads:v", str(self.threads)]
        if audio_path is not None:
            # audio padded with silence or cut to exactly the video's length, the same bytes every run (-shortest
            # cuts wherever the muxer happens to be when the video ends); the channels mixed first (5.1 to stereo)
            cmd += fmt.audio_args(1, float(frames / self.fps), self.soundtrack.filters(), self.soundtrack.channels)
        if comment:
            cmd += ["-metadata", f"comment={comment}"]
            if fmt.container == "mxf":      # MXF keeps no comment: the identification's version string carries it
                cmd += ["-metadata", f"product_version={comment}"]
        cmd += [*fmt.muxer_args(), str(self._tmp_path)]
        try:
            self._proc = _spawn(cmd, self._stderr, pass_fds=(self._lock_fd,))
        except OSError as exc:
            raise DittoError(f"writing {self.out_path} failed: cannot start ffmpeg ({exc}); "
                             f"reinstall imageio-ffmpeg") from None

    def write(self, frame: np.ndarray) -> None:
        """Append one frame at the writer's size: uint8 [H, W, 3] RGB, or planes as yuv.Layout.shape says (uint16
        for 10 bits)."""
        if self._done:
            raise ValueError("write() on a closed VideoWriter")
        w, h = self.size
        shape = (h, w, 3) if self._layout is None else self._layout.shape(w, h)
        dtype = np.uint8 if self._layout is None else self._layout.dtype
        if frame.dtype != dtype or frame.shape != shape:
            raise ValueError(f"frame must be {np.dtype(dtype)} {list(shape)}, got {frame.dtype} {frame.shape}")
        try:
            self._proc.stdin.write(memoryview(np.ascontiguousarray(frame)).cast("B"))
        except (BrokenPipeError, OSError, ValueError):
            self._fail()
        self.frames_written += 1

    def close(self) -> Path:
        """Finish the file and move it to out_path; returns out_path."""
        if self._done:
            return self.out_path
        try:
            self._proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        rc = self._proc.wait()
        if rc != 0 or self.frames_written == 0:
            self._fail("no frames were written" if rc == 0 else None)
        if self._check is not None:
            try:
                self.checked = self._check(self._tmp_path)
            except BaseException:
                self.abort()
                raise
        try:
            give_usual_mode(self._tmp_path)
            os.replace(self._tmp_path, self.out_path)
        except OSError as exc:
            self.abort()
            raise InputError(f"writing {self.out_path} failed: {exc.strerror}; "
                             f"check the directory still exists and is writable") from None
        self._done = True
        self._stderr.close()
        self._unlock()
        return self.out_path

    def abort(self) -> None:
        """Kill ffmpeg and remove the temporary file; out_path is left as it was."""
        if self._done:
            return
        self._done = True
        if self._proc.poll() is None:
            self._proc.kill()
        try:
            self._proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        self._proc.wait()
        self._cleanup_files()

    def _fail(self, reason: str | None = None) -> None:
        """Abort and raise the error naming the output file and ffmpeg's last complaint."""
        if self._proc.poll() is None:
            try:
                self._proc.wait(timeout=2)    # let ffmpeg finish printing why it stopped
            except subprocess.TimeoutExpired:
                pass
        if reason is None:
            reason = last_stderr_line(self._stderr) or f"ffmpeg exited with status {self._proc.poll()}"
        self.abort()
        raise InputError(f"writing {self.out_path} failed: {reason} "
                         f"(check free disk space and that the directory is writable)")

    def _cleanup_files(self) -> None:
        try:
            self._tmp_path.unlink()
        except FileNotFoundError:
            pass
        self._stderr.close()
        self._unlock()

    def _unlock(self) -> None:
        """Release the temporary file's flock (closing its descriptor)."""
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __del__(self) -> None:
        if getattr(self, "_done", True) is False and hasattr(self, "_proc"):
            self.abort()
