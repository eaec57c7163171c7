"""Background plate, the one owner of it: how registration encodes it, the mirror-loop rule, and reading it back.

Registration writes a video avatar's plate with `plate_encoder_args` (or an image avatar's with
`write_plate_image`); rendering and the condition builder walk the avatar's frames in the order
`mirror_index` gives, and `PlateReader` streams the plate back in that order.

Memory: a video plate is decoded in aligned blocks of `block_frames` frames (default 25, one second).
Only the current block is held ([K, H, W, 3] uint8, ~155 MB for 1080p at K=25; half that as yuv420p). Forward runs keep
one ffmpeg decoder streaming block after block; a reverse run re-opens the decoder with an input
seek (-ss) at the start of each block and serves that block backwards. Plates encoded with
`plate_encoder_args` have a keyframe exactly every `PLATE_KEYINT` frames, so each seek lands on a
keyframe and costs no extra decoding.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from ditto_fast.errors import AvatarError, InputError
from ditto_fast.ffpipe import RawVideoPipe, TruncatedFrame, colorspace_tag, video_stream_line
from ditto_fast.rates import from_stream
from ditto_fast.yuv import COLORSPACE_TAG, matrix_for_tag, rgb_to_i420

PLATE_KEYINT = 25          # keyframe interval of written plates == default read block
PLATE_CRF = 16
# ultrafast crf 16: the same PSNR against the source as veryfast crf 13 (51.9 dB on the benchmark
# anchor) for under half the encode CPU; the larger file hardly matters beside f_s (4 MiB a frame)
PLATE_PRESET = "ultrafast"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp"}


def mirror_index(i: int, n: int) -> int:
    """Plate frame for output frame i when looping n frames forward then backward: 0..n-1, n-1..0, 0.."""
    if n <= 0:
        raise ValueError(f"plate frame count must be positive, got {n}")
    r = i % (2 * n)
    return r if r < n else 2 * n - 1 - r


def mirror_indices(n_out: int, n_src: int) -> np.ndarray:
    """Source frame [n_out] int64 for each of n_out output frames, by mirror_index over n_src frames (at least 1)."""
    return mirror_positions(np.arange(n_out, dtype=np.int64), n_src)


def mirror_positions(positions: np.ndarray, n_src: int) -> np.ndarray:
    """mirror_index of each position [K] (frame numbers on an endless forward timeline) -> int64 [K]."""
    n = max(1, int(n_src))
    r = np.asarray(positions, dtype=np.int64) % (2 * n)
    return np.where(r < n, r, 2 * n - 1 - r)


def plate_encoder_args() -> list[str]:
    """ffmpeg output options of a video plate: H.264 yuv420p, crf 16 ultrafast, keyframe every PLATE_KEYINT frames."""
    k = str(PLATE_KEYINT)
    return ["-c:v", "libx264", "-preset", PLATE_PRESET, "-crf", str(PLATE_CRF), "-pix_fmt", "yuv420p",
            "-g", k, "-keyint_min", k, "-sc_threshold", "0", "-an", "-movflags", "+faststart", "-f", "mp4"]


def write_plate_image(frame_rgb: np.ndarray, path: str | os.PathLike) -> None:
    """Write the background of an image avatar (PNG, lossless)."""
    path = Path(path)
    if not cv2.imwrite(str(path), cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2BGR)):
        raise InputError(f"{path}: cannot write the background image; check the avatar store has free space "
                         "and is writable")


def probe_video(path: str | os.PathLike) -> tuple[tuple[int, int], Fraction, str]:
    """((width, height), exact frame rate, colour matrix) of the first video stream, from ffmpeg's description;
    the matrix is the one ffmpeg decodes it with (see yuv.matrix_for_tag)."""
    line = video_stream_line(path)
    size = re.search(r", (\d{2,5})x(\d{2,5})", line) if line else None
    if size is None:
        raise AvatarError(f"{path}: not a readable video plate; re-register the avatar")
    fps = re.search(r", ([\d.]+) fps", line)
    return ((int(size.group(1)), int(size.group(2))), from_stream(float(fps.group(1))) if fps else Fraction(25),
            matrix_for_tag(colorspace_tag(line)))


def _convert_to_bt709(matrix: str) -> list[str]:
    """ffmpeg filter options that re-matrix limited-range yuv420p from `matrix` to BT.709 (none when it is)."""
    if matrix == "bt709":
        return []
    return ["-vf", f"colorspace=ispace={COLORSPACE_TAG[matrix]}:iprimaries=bt709:itrc=bt709:irange=tv:"
                   "space=bt709:primaries=bt709:trc=bt709:range=tv:format=yuv420p"]


class _Decoder:
    """One ffmpeg process decoding RGB frames forward from plate frame `start`."""

    def __init__(self, path: Path, size: tuple[int, int], fps: Fraction, start: int, pix_fmt: str = "rgb24",
                 matrix: str = "bt709"):
        args: list[str] = []
        if start > 0:
            # input seek, accurate by default: frames with pts < t are dropped, so half a frame
            # before frame `start` keeps exactly `start` as the first frame out
            args += ["-ss", f"{float((start - Fraction(1, 2)) / fps):.6f}"]
        args += ["-i", str(path), "-map", "0:v:0", "-fps_mode", "passthrough",
                 *(_convert_to_bt709(matrix) if pix_fmt == "yuv420p" else []),
                 "-f", "rawvideo", "-pix_fmt", pix_fmt, "pipe:1"]
        self._pipe = RawVideoPipe(args)
        self.next_index = start

    def read_into(self, buf: np.ndarray) -> bool:
        """Fill buf (one frame) with the next frame; False at the end of the stream."""
        try:
            if not self._pipe.read_into(buf):
                return False
        except TruncatedFrame:
            raise AvatarError("plate decoding stopped mid-frame; re-register the avatar") from None
        self.next_index += 1
        return True

    def close(self) -> None:
        self._pipe.close()


class PlateReader:
    """Background frame for each output frame i: plate frame mirror_index(i, n), as a fresh writable array.

    `path` may be a descriptor's path (/proc/PID/fd/N; then say `is_image`): the plate read is then the
    file that descriptor holds, even after the avatar was replaced or removed.
    `pix_fmt`: "rgb24" gives [H, W, 3] RGB frames; "yuv420p" gives the plate's own limited-range BT.709
    yuv420p bytes as [H * 3 / 2, W] (a plate in another matrix is re-matrixed by ffmpeg; an image is converted).
    """

    def __init__(self, path: str | os.PathLike, n_plate_frames: int, block_frames: int = PLATE_KEYINT,
                 is_image: bool | None = None, pix_fmt: str = "rgb24"):
        if pix_fmt not in ("rgb24", "yuv420p"):
            raise ValueError(f"pix_fmt must be rgb24 or yuv420p, got {pix_fmt}")
        self.pix_fmt = pix_fmt
        self.path = Path(path)
        if not self.path.is_file():
            raise AvatarError(f"{self.path}: background plate is missing; re-register the avatar")
        self.is_image = self.path.suffix.lower() in IMAGE_SUFFIXES if is_image is None else is_image
        self._decoder: _Decoder | None = None
        if self.is_image:
            bgr = cv2.imread(str(self.path), cv2.IMREAD_COLOR)
            if bgr is None:
                raise AvatarError(f"{self.path}: background image is unreadable; re-register the avatar")
            self._image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)    # [H, W, 3] uint8
            self.n = 1
            self.size = (self._image.shape[1], self._image.shape[0])
            if pix_fmt == "yuv420p":
                self._image = rgb_to_i420(self._image)           # [H * 3 / 2, W] uint8
            return
        if n_plate_frames <= 0:
            raise ValueError(f"n_plate_frames must be positive, got {n_plate_frames}")
        self.n = int(n_plate_frames)
        self.size, self.fps, self.matrix = probe_video(self.path)
        self.block_frames = max(1, int(block_frames))
        w, h = self.size
        shape = (h, w, 3) if pix_fmt == "rgb24" else (h * 3 // 2, w)
        self._block = np.empty((min(self.block_frames, self.n), *shape), np.uint8)   # [K, *frame]
        self._block_start = -1
        self._block_len = 0

    def __enter__(self) -> PlateReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the decoder."""
        if self._decoder is not None:
            self._decoder.close()
            self._decoder = None

    def __del__(self) -> None:
        if getattr(self, "_decoder", None) is not None:
            self.close()

    def __getitem__(self, i: int) -> np.ndarray:
        """Background for output frame i (see pix_fmt)."""
        return self.frame(mirror_index(i, self.n))

    def __iter__(self) -> Iterator[np.ndarray]:
        """Backgrounds for output frames 0, 1, 2, ... (endless)."""
        for i in itertools.count():
            yield self[i]

    def frame(self, k: int) -> np.ndarray:
        """Plate frame k (0 <= k < n): uint8 (see pix_fmt), a copy the caller may modify."""
        if self.is_image:
            return self._image.copy()
        if not 0 <= k < self.n:
            raise IndexError(f"plate frame {k} out of range 0..{self.n - 1}")
        if not self._block_start <= k < self._block_start + self._block_len:
            self._load_block(k - k % self.block_frames)
        return self._block[k - self._block_start].copy()

    def _load_block(self, start: int) -> None:
        """Decode frames [start, start + K) into the block buffer, seeking only when not already there."""
        if self._decoder is None or self._decoder.next_index != start:
            self.close()
            self._decoder = _Decoder(self.path, self.size, self.fps, start, self.pix_fmt, self.matrix)
        count = min(self.block_frames, self.n - start)
        self._block_start, self._block_len = start, 0
        for j in range(count):
            if not self._decoder.read_into(self._block[j]):
                self.close()
                raise AvatarError(f"{self.path}: plate has {start + j} frames but the avatar expects {self.n}; "
                                  f"re-register the avatar")
            self._block_len = j + 1
