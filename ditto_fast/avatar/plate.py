"""Background plate, the one owner of it: how registration encodes it and reading it back.

A video avatar's plate is the source's own video stream, copied (no generation at all), wherever registration
reads the source's frames unchanged (see plate_copy.py); otherwise registration encodes it with
`plate_encoder_args` from the frames it reads. An image avatar's plate is written by `write_plate_image`.
Rendering and the condition builder walk the avatar's frames in the order the mirror loop (`media/rates.py`)
gives, and `PlateReader` streams the plate back in that order.

Memory: a video plate is decoded in aligned blocks of `block_frames` frames (default 25, one second),
each by one ffmpeg process seeking (-ss) to the block's first frame and writing the block into an
anonymous memory file. At most two blocks are held: the one being served and, when the caller gave the
order it will read in, the next block of that order, which ffmpeg decodes while the current one is
served ([K, H, W, 3] uint8 each, ~155 MB for 1080p at K=25; half that as yuv420p, 207 MB as 10-bit 4:2:2 planes).

Layout: the plate keeps the source's chroma up to 4:2:2 and its depth up to 10 bits (yuv.layout_for). An encoded
plate is H.264 ultrafast: 8-bit 4:2:0 lossless (qp 0), 4:2:2 or 10-bit High 4:2:2 at crf 4 (PLATE_QUALITY),
with a keyframe exactly every `PLATE_KEYINT` frames, so each seek lands on a keyframe and decodes nothing twice.
A copied plate has the source's own keyframes; a seek decodes from the one before the block.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import tempfile
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import IO

import cv2
import numpy as np

from ditto_fast.core.errors import AvatarError, InputError
from ditto_fast.media.ffpipe import RawVideoPipe, colorspace_tag, pixel_format, video_stream_line
from ditto_fast.media.rates import from_stream
from ditto_fast.media.timeline import mirror_index
from ditto_fast.media.yuv import COLORSPACE_TAG, I420, Layout, layout_for, matrix_for_tag, rgb_to_i420

PLATE_KEYINT = 25          # keyframe interval of encoded plates == default read block
PLATE_PRESET = "ultrafast"
# x264's quality per layout of an encoded plate (docs/performance.md, "The plate as shot"). On a grainy moving 720p
# camera clip, 8-bit 4:2:0 crf 16 (the plate before) was 1.1 levels of luma off in the moving body (3.8 on a held-out
# clip), qp 0 (lossless) 0 at 3.5 times crf 16's size; 10-bit 4:2:2 crf 10 was 0.72 off (1.0 in its worst frame),
# crf 4 0.36 at half of qp 0's size (qp 0 is twice a ProRes HQ source's)
PLATE_QUALITY = ["-qp", "0"]                # 8-bit 4:2:0: lossless
PLATE_QUALITY_FINE = ["-crf", "4"]          # 4:2:2 or 10 bits
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp"}


def plate_encoder_args(layout: Layout = I420) -> list[str]:
    """ffmpeg output options of an encoded video plate: H.264 in `layout` (8-bit 4:2:0 lossless; 4:2:2 or 10-bit,
    High 4:2:2 at crf 4), ultrafast, a keyframe every PLATE_KEYINT frames."""
    k = str(PLATE_KEYINT)
    quality = PLATE_QUALITY if layout == I420 else PLATE_QUALITY_FINE
    return ["-c:v", "libx264", "-preset", PLATE_PRESET, *quality, "-pix_fmt", layout.pix_fmt,
            "-g", k, "-keyint_min", k, "-sc_threshold", "0", "-an", "-movflags", "+faststart", "-f", "mp4"]


def plate_encoding(layout: Layout = I420) -> str:
    """What `plate_encoder_args` makes of a plate in `layout`, in words (for the avatar's record)."""
    return "H.264 lossless" if layout == I420 else f"H.264 High 4:2:2 {' '.join(PLATE_QUALITY_FINE).lstrip('-')}"


def write_plate_image(frame_rgb: np.ndarray, path: str | os.PathLike) -> None:
    """Write the background of an image avatar (PNG, lossless)."""
    path = Path(path)
    if not cv2.imwrite(str(path), cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2BGR)):
        raise InputError(f"{path}: cannot write the background image; check the avatar store has free space "
                         "and is writable")


def probe_video(path: str | os.PathLike) -> tuple[tuple[int, int], Fraction, str, str | None]:
    """((width, height), exact frame rate, colour matrix, pixel format) of the first video stream, from ffmpeg's
    description; the matrix is the one ffmpeg decodes it with (see yuv.matrix_for_tag)."""
    line = video_stream_line(path)
    size = re.search(r", (\d{2,5})x(\d{2,5})", line) if line else None
    if size is None:
        raise AvatarError(f"{path}: not a readable video plate; re-register the avatar")
    fps = re.search(r", ([\d.]+) fps", line)
    return ((int(size.group(1)), int(size.group(2))), from_stream(float(fps.group(1))) if fps else Fraction(25),
            matrix_for_tag(colorspace_tag(line)), pixel_format(line))


def _convert_to_bt709(matrix: str, layout: Layout) -> list[str]:
    """ffmpeg filter options that re-matrix limited-range YUV in `layout` from `matrix` to BT.709 (none when it is)."""
    if matrix == "bt709":
        return []
    return ["-vf", f"colorspace=ispace={COLORSPACE_TAG[matrix]}:iprimaries=bt709:itrc=bt709:irange=tv:"
                   f"space=bt709:primaries=bt709:trc=bt709:range=tv:format={layout.pix_fmt}"]


def seek_time(start: int, fps: Fraction) -> str:
    """ffmpeg's -ss for plate frame `start`: its exact time, to the microsecond. ffmpeg rounds that to the
    stream's tick, so the seek lands on the frame itself: from a keyframe nothing is decoded twice (half a
    frame earlier, the seek went back to the keyframe a block before and decoded that block for nothing)."""
    us = round(Fraction(start) / fps * 1_000_000)
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def _anonymous_file():
    """A read-write file with no name (memory-backed where Linux offers memfd); gone when closed."""
    try:
        return os.fdopen(os.memfd_create("ditto-fast-plate", os.MFD_CLOEXEC), "w+b")
    except (AttributeError, OSError):
        return tempfile.TemporaryFile()


class _BlockDecode:
    """One ffmpeg process decoding a block of `count` plate frames from `start` into `frames_file` (the
    caller's, reused block after block), in the background: started now, waited for by `wait()`.
    `args`: ffmpeg's input and output arguments for the block, output `pipe:1`."""

    def __init__(self, path: Path, start: int, count: int, frame_bytes: int, args: list[str],
                 frames_file: IO[bytes]):
        self.path, self.start, self.count, self.frame_bytes = path, start, count, frame_bytes
        self.frames_file = frames_file
        os.lseek(frames_file.fileno(), 0, os.SEEK_SET)   # ffmpeg writes from this offset, which we share
        try:
            self._pipe = RawVideoPipe(args, into=frames_file)
        except OSError as exc:
            raise AvatarError(f"{path}: cannot start ffmpeg to read the plate ({exc}); reinstall imageio-ffmpeg") \
                from None

    def wait(self, n_plate: int) -> None:
        """Wait until the block is decoded. AvatarError if ffmpeg failed or the plate has fewer than the
        avatar's `n_plate` frames; InputError if a file-size limit (ulimit -f) stopped it."""
        code, why = self._pipe.wait()
        size = os.lseek(self.frames_file.fileno(), 0, os.SEEK_CUR)      # what ffmpeg wrote
        if code == -signal.SIGXFSZ or "File too large" in why:
            need = self.count * self.frame_bytes
            raise InputError(f"{self.path}: reading the plate needs {need / 2**20:.0f} MiB of memory file a block, "
                             f"more than this process's file-size limit allows; raise it (ulimit -f unlimited)")
        if code != 0:
            raise AvatarError(f"{self.path}: plate decoding failed ({why}); re-register the avatar")
        if size % self.frame_bytes:
            raise AvatarError(f"{self.path}: plate decoding stopped mid-frame; re-register the avatar")
        if size < self.count * self.frame_bytes:
            raise AvatarError(f"{self.path}: plate has {self.start + size // self.frame_bytes} frames but the "
                              f"avatar expects {n_plate}; re-register the avatar")

    def read_into(self, j: int, out: np.ndarray) -> None:
        """Copy the block's frame j into the contiguous array `out` (after wait())."""
        view, fd = memoryview(out).cast("B"), self.frames_file.fileno()
        got = 0
        while got < len(view):
            n = os.preadv(fd, [view[got:]], j * self.frame_bytes + got)
            if n <= 0:
                raise AvatarError(f"{self.path}: plate block vanished while read; re-register the avatar")
            got += n

    def close(self) -> None:
        """Stop ffmpeg if it still runs (the frames file stays the caller's)."""
        self._pipe.close()


class PlateReader:
    """Background frame for each output frame i: plate frame mirror_index(i, n), as a fresh writable array.

    `path` may be a descriptor's path (/proc/PID/fd/N; then say `is_image`): the plate read is then the
    file that descriptor holds, even after the avatar was replaced or removed.
    `pix_fmt`: "rgb24" gives [H, W, 3] RGB frames; "yuv420p" gives limited-range BT.709 yuv420p [H * 3 / 2, W];
    "planes" gives the plate's own planes in its own layout (`layout`: 4:2:0 or 4:2:2, 8 or 10 bits, see
    yuv.Layout), as stored (a plate in another matrix is re-matrixed by ffmpeg; an image is converted to yuv420p).
    `order`: the plate frames the caller will ask for, in that order (a render knows them all): while one
    block is served, ffmpeg decodes the next block of the order in the background. Frames asked for
    out of that order are still served, their block decoded on the spot.
    """

    def __init__(self, path: str | os.PathLike, n_plate_frames: int, block_frames: int = PLATE_KEYINT,
                 is_image: bool | None = None, pix_fmt: str = "rgb24", order: Sequence[int] | None = None):
        if pix_fmt not in ("rgb24", "yuv420p", "planes"):
            raise ValueError(f"pix_fmt must be rgb24, yuv420p or planes, got {pix_fmt}")
        self.layout = I420
        self.pix_fmt = pix_fmt
        self.path = Path(path)
        if not self.path.is_file():
            raise AvatarError(f"{self.path}: background plate is missing; re-register the avatar")
        self.is_image = self.path.suffix.lower() in IMAGE_SUFFIXES if is_image is None else is_image
        self._current: _BlockDecode | None = None       # the block being served
        self._next: _BlockDecode | None = None          # the block after it in `order`, decoding
        self._files: list[IO[bytes]] = []               # the two blocks' memory files, kept while open
        if self.is_image:
            bgr = cv2.imread(str(self.path), cv2.IMREAD_COLOR)
            if bgr is None:
                raise AvatarError(f"{self.path}: background image is unreadable; re-register the avatar")
            self._image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)    # [H, W, 3] uint8
            self.n = 1
            self.size = (self._image.shape[1], self._image.shape[0])
            if pix_fmt != "rgb24":
                self._image = rgb_to_i420(self._image)           # [H * 3 / 2, W] uint8
            return
        if n_plate_frames <= 0:
            raise ValueError(f"n_plate_frames must be positive, got {n_plate_frames}")
        self.n = int(n_plate_frames)
        self.size, self.fps, self.matrix, stored = probe_video(self.path)
        if pix_fmt == "planes":
            self.layout = layout_for(stored)
        self.block_frames = max(1, int(block_frames))
        w, h = self.size
        self._shape = (h, w, 3) if pix_fmt == "rgb24" else self.layout.shape(w, h)
        self._dtype = np.uint8 if pix_fmt == "rgb24" else self.layout.dtype
        # a decoding thread per 1080p of picture: a block has a block's worth of frames' time to be ready,
        # and more threads would only take cores from the networks and the encoder
        self._threads = str(max(1, round(w * h / (1920 * 1080))))
        # the order's blocks (their first frames), each run of one block once; _at: the current one's place
        blocks = np.asarray(order if order is not None else [], np.int64) // self.block_frames * self.block_frames
        self._plan = blocks[np.r_[True, blocks[1:] != blocks[:-1]]] if len(blocks) else blocks
        self._at = 0
        if len(self._plan):                             # the first block decodes while the caller prepares
            self._next = self._decode(int(self._plan[0]))

    def __enter__(self) -> PlateReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the decoders and free the decoded blocks."""
        for job in (self._current, self._next):
            if job is not None:
                job.close()
        self._current = self._next = None
        for f in self._files:
            f.close()
        self._files = []

    def __del__(self) -> None:
        if getattr(self, "_files", None):
            self.close()

    def __getitem__(self, i: int) -> np.ndarray:
        """Background for output frame i (see pix_fmt)."""
        return self.frame(mirror_index(i, self.n))

    def __iter__(self) -> Iterator[np.ndarray]:
        """Backgrounds for output frames 0, 1, 2, ... (endless)."""
        for i in itertools.count():
            yield self[i]

    def frame(self, k: int) -> np.ndarray:
        """Plate frame k (0 <= k < n): uint8, or uint16 for 10-bit planes (see pix_fmt), a copy the caller may
        modify."""
        if self.is_image:
            return self._image.copy()
        if not 0 <= k < self.n:
            raise IndexError(f"plate frame {k} out of range 0..{self.n - 1}")
        start = k - k % self.block_frames
        if self._current is None or self._current.start != start:
            self._serve_block(start)
        out = np.empty(self._shape, self._dtype)
        self._current.read_into(k - start, out)
        return out

    def _decode(self, start: int) -> _BlockDecode:
        """Start decoding the block that begins at plate frame `start`, into a memory file no live block uses."""
        if not self._files:
            self._files = [_anonymous_file(), _anonymous_file()]
        busy = [job.frames_file for job in (self._current, self._next) if job is not None]
        free = next(f for f in self._files if all(f is not b for b in busy))
        count = min(self.block_frames, self.n - start)
        args = ["-threads", self._threads, "-filter_threads", self._threads]
        args += ["-ss", seek_time(start, self.fps)] if start > 0 else []
        args += ["-i", str(self.path), "-map", "0:v:0", "-fps_mode", "passthrough",
                 *(_convert_to_bt709(self.matrix, self.layout) if self.pix_fmt != "rgb24" else []),
                 "-frames:v", str(count), "-f", "rawvideo",
                 "-pix_fmt", self.pix_fmt if self.pix_fmt == "rgb24" else self.layout.pix_fmt, "pipe:1"]
        frame_bytes = int(np.prod(self._shape)) * np.dtype(self._dtype).itemsize
        return _BlockDecode(self.path, start, count, frame_bytes, args, free)

    def _serve_block(self, start: int) -> None:
        """Make the block at `start` the current one (the one decoded ahead, if it is that block), then start
        decoding the block that follows it in the order."""
        ahead, self._next = self._next, None
        if ahead is not None and ahead.start != start:      # asked for out of order: that block is not wanted
            ahead.close()
            ahead = None
        if self._current is not None:
            self._current.close()
            self._current = None
        job = ahead or self._decode(start)
        try:
            job.wait(self.n)
        except BaseException:
            job.close()
            raise
        self._current = job
        following = self._following(start)
        if following is not None:
            self._next = self._decode(following)

    def _following(self, start: int) -> int | None:
        """The block after `start` in the order (None at its end, or when `start` is not in it from here on)."""
        plan = self._plan
        for i in range(self._at, len(plan)):
            if plan[i] == start:
                self._at = i
                return int(plan[i + 1]) if i + 1 < len(plan) else None
        return None
