"""Open a registration source by content (image or video); stream a video's frames at its own rate and write its plate."""

from __future__ import annotations

import errno
import logging
import re
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import cv2
import imageio_ffmpeg
import numpy as np
from PIL import Image

from ditto_fast.core.errors import InputError
from ditto_fast.media.inputs import check_input_file
from ditto_fast.media.ffpipe import RawVideoPipe, TruncatedFrame, colorspace_tag, stream_lines
from ditto_fast.media.rates import MOTION_FPS, from_stream, nearest_standard, rate_text
from ditto_fast.media.yuv import I420, YuvFrame
from ditto_fast.avatar.picture import Picture, read_picture
from ditto_fast.avatar.plate import plate_encoder_args

logging.getLogger("imageio_ffmpeg").setLevel(logging.ERROR)

_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"BM", b"GIF8", b"II*\x00", b"MM\x00*", b"RIFF")


@dataclass
class SourceInfo:
    path: Path
    is_image: bool
    src_size: tuple[int, int]     # (w, h) as stored
    size: tuple[int, int]         # (w, h) after resizing: long side <= max_size, even dims
    src_fps: float
    est_frames: int               # frames at `rate` (exact for images)
    colorspace: str | None = None  # the video stream's colorspace tag (bt709, smpte170m, ...), None if untagged
    rate: Fraction = Fraction(MOTION_FPS)   # the rate frames are kept at: the source's own (images: 25)
    rate_note: str | None = None  # why the rate is not the source's exact one (variable-rate sources)
    duration: float = 0.0         # seconds the container declares (0 if it declares none)
    picture: Picture = Picture("bt601")   # pixel aspect, colour matrix and transfer of a video (see picture.py)
    codec: str | None = None      # the video stream's codec as ffmpeg names it (h264, hevc, prores, ...)
    turned: bool = False          # a rotation tag turns its frames a quarter (stored w x h, shown h x w)


def target_size(w: int, h: int, max_size: int) -> tuple[int, int]:
    """Scale (w, h) so the long side is at most max_size, then round both down to even numbers."""
    s = min(1.0, max_size / max(w, h))
    tw, th = max(2, int(round(w * s)) // 2 * 2), max(2, int(round(h * s)) // 2 * 2)
    return tw, th


# EXIF orientation (1..8) -> the numpy operation that turns the stored pixels upright
_UPRIGHT = {
    2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 4: lambda a: a[::-1],
    5: lambda a: a.swapaxes(0, 1), 6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1), 8: lambda a: np.rot90(a, 1),
}


def exif_orientation(path: Path) -> int:
    """The EXIF orientation tag of an image file (1 = as stored, also when absent or unreadable)."""
    try:
        with Image.open(path) as im:
            value = im.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - any EXIF Pillow cannot read (corrupt, a "decompression bomb"): as stored
        return 1
    return value if value in _UPRIGHT else 1


def _read_image(path: Path) -> np.ndarray | None:
    """RGB uint8 of an image file, upright by its EXIF orientation; None if `path` is not an image."""
    head = path.open("rb").read(16)
    if not any(head.startswith(m) for m in _IMAGE_MAGIC) or (head.startswith(b"RIFF") and head[8:12] != b"WEBP"):
        return None
    # colour, 8 bits (16-bit samples scaled by the fixed 1/256, as Ditto reads them), alpha dropped
    try:
        img = cv2.imread(str(path), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    except cv2.error:          # e.g. a header declaring more pixels than OpenCV will allocate
        img = None
    if img is None:
        raise InputError(f"{path}: image is truncated or corrupt; re-export it as PNG or JPEG")
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    turn = _UPRIGHT.get(exif_orientation(path))
    return np.ascontiguousarray(turn(img)) if turn else img


def open_source(path: str | Path, max_size: int, source_colour: str = "auto") -> tuple[SourceInfo, np.ndarray | None]:
    """Probe `path` by content; returns its info and, for an image, the resized RGB image. A video is kept with
    square pixels at its display size (at most `max_size`), in the colour matrix its tags or `source_colour` say."""
    path = Path(path)
    check_input_file(path, "the anchor video or image file")
    img = _read_image(path)
    if img is not None:
        h, w = img.shape[:2]
        tw, th = target_size(w, h, max_size)
        if (tw, th) != (w, h):
            img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA)
        return SourceInfo(path, True, (w, h), (tw, th), 0.0, 1), np.ascontiguousarray(img)

    streams = stream_lines(path)
    line = next((ln for ln in streams if ": Video: " in ln and "(attached pic)" not in ln), None)  # not cover art
    if streams and line is None:
        raise InputError(f"{path}: has no video stream (an audio-only file?); give the anchor's video or an image")
    try:
        gen = imageio_ffmpeg.read_frames(str(path))
        meta = next(gen)
        gen.close()
    except (OSError, RuntimeError, StopIteration, IndexError, ValueError, AttributeError) as e:  # + header parsing
        if "partial file" in str(e):
            raise InputError(f"{path}: video is cut short, not one frame decodes (ffmpeg: partial file); copy or "
                             "re-export the whole file") from None
        msg = str(e).strip().splitlines()[-1][:120] if str(e).strip() else "no video stream"
        raise InputError(f"{path}: not a readable video or image ({msg}); give an MP4/MOV/MKV video "
                         "or a PNG/JPEG image") from None
    w, h = meta["size"]
    if w <= 0 or h <= 0:
        raise InputError(f"{path}: video has no picture size; re-export it")
    duration = float(meta.get("duration") or 0.0)
    line = line or ""
    picture = read_picture(line, (w, h), source_colour)
    tw, th = target_size(*picture.display_size((w, h)), max_size)
    rate, note = stream_rate(line)
    turned = tuple(meta.get("source_size") or (w, h)) != (w, h)
    return SourceInfo(path, False, (w, h), (tw, th), float(meta.get("fps") or rate), max(1, int(round(duration * rate))),
                      colorspace_tag(line), rate, note, duration, picture, meta.get("codec"), turned), None


def stream_rate(line: str) -> tuple[Fraction, str | None]:
    """The rate to keep a video at, from ffmpeg's stream line: a constant rate as it is; a variable one
    (average "fps" and base "tbr" rates differ) at its average, rounded to the nearest standard rate,
    with a note saying so."""
    fps = re.search(r", ([\d.]+) fps", line)
    tbr = re.search(r", ([\d.]+)(k?) tbr", line)
    avg = float(fps.group(1)) if fps else None
    base = float(tbr.group(1)) * (1000 if tbr.group(2) else 1) if tbr else None
    if avg is None and base is None:
        return Fraction(MOTION_FPS), f"the video states no frame rate; kept at {MOTION_FPS} fps"
    if avg is None or avg <= 0:
        if base is None or base <= 0:
            return Fraction(MOTION_FPS), f"the video states no frame rate; kept at {MOTION_FPS} fps"
        return from_stream(base), None
    if base is not None and abs(avg - base) > 1e-3 * base:
        rate = nearest_standard(avg)
        return rate, (f"variable frame rate (average {avg:g} fps); frames kept at the nearest standard rate, "
                      f"{rate_text(rate)} fps")
    return from_stream(avg), None


def _picture_graph(info: SourceInfo, outputs: list[str]) -> str:
    """ffmpeg's filter graph from the source's video to limited-range YUV in the plate's layout at `info.size` and
    `info.rate` (see Picture.filter_chain), split into the labels `outputs`; "raw" is brought to yuv420p."""
    chain = "[0:v:0]" + info.picture.filter_chain(info.size, info.rate)
    to_raw = "" if info.picture.plate_layout == I420 else "format=yuv420p"
    labels = ["full" if (o == "raw" and to_raw) else o for o in outputs]
    graph = chain + (f",split={len(labels)}" if len(labels) > 1 else "") + "".join(f"[{lb}]" for lb in labels)
    return graph + (f";[full]{to_raw}[raw]" if "full" in labels else "")


def encode_plate(info: SourceInfo, plate: str | Path, frames: int) -> None:
    """Encode the plate from the source in a pass of its own: its first `frames` frames as registration reads them
    (what a copy of the source's stream is replaced by when it did not decode to those frames). InputError if
    ffmpeg fails; OSError ENOSPC if the plate's disk filled up."""
    args = ["-y", "-i", str(info.path), "-filter_complex", _picture_graph(info, ["enc"]), "-map", "[enc]",
            "-frames:v", str(int(frames)), *plate_encoder_args(info.picture.plate_layout), str(plate)]
    res = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", *args],
                         capture_output=True, text=True, errors="replace")
    if "No space left on device" in res.stderr:
        raise OSError(errno.ENOSPC, "No space left on device (writing the plate)")
    if res.returncode != 0:
        last = res.stderr.strip().splitlines()[-1][:160] if res.stderr.strip() else f"ffmpeg exit {res.returncode}"
        raise InputError(f"{info.path}: cannot encode the background plate ({last}); re-export the video")


class SourceFrames:
    """A video source decoded once by one ffmpeg process: frames at `info.rate` (the source's own) and resized, as
    yuv420p (limited range, the source's colour matrix) read into a ring of `ring` preallocated
    buffers; the same process encodes those very frames as the plate (`plate`), or, where the plate is the
    source's own stream copied, writes each frame's MD5 in the plate's layout (`frame_sums`, ffmpeg's framemd5)
    for the copy to be checked against.

    Iterating yields YuvFrame views into the ring: a frame stays valid until `ring` - 1 more have been
    yielded, so a caller keeping frames in a queue must keep fewer than `ring`. ffmpeg may decode up
    to `ahead` frames beyond the one last read (it works while the caller does something else, e.g.
    runs the networks). `finish()` waits for ffmpeg and so for a complete plate; `close()` (or
    leaving the `with` block) stops it.
    """

    def __init__(self, info: SourceInfo, max_frames: int | None = None, ring: int = 2,
                 plate: str | Path | None = None, ahead: int = 8, frame_sums: str | Path | None = None) -> None:
        if info.is_image:
            raise ValueError("SourceFrames reads videos; an image source is a single frame")
        w, h = info.size
        matrix = info.picture.kept_matrix
        # the source's matrix (as tagged, or assumed), stated and tagged so the plate decodes with it too; full
        # range (yuvj) sources are brought to limited range, as broadcast video is; HDR is tone-mapped to SDR.
        # The face is looked at in 8-bit 4:2:0; the plate keeps the source's 4:2:2 and 10 bits (see plate.py)
        limit = ["-frames:v", str(int(max_frames))] if max_frames is not None else []
        outputs = ["raw", *(["enc"] if plate is not None else []), *(["sums"] if frame_sums is not None else [])]
        args = ["-i", str(info.path), "-filter_complex", _picture_graph(info, outputs)]
        if plate is not None:
            args += ["-map", "[enc]", *limit, *plate_encoder_args(info.picture.plate_layout), str(plate)]
        if frame_sums is not None:
            args += ["-map", "[sums]", *limit, "-f", "framemd5", "-y", str(frame_sums)]
        # the raw output's queue lets ffmpeg run `ahead` frames (1.5 bytes a pixel each) in front of the reader
        args += ["-map", "[raw]", *limit, "-thread_queue_size", str(max(1, int(ahead))),
                 "-f", "rawvideo", "pipe:1"]
        self.info = info
        self.max_frames = max_frames
        self.count = 0
        bufs = np.empty((max(2, int(ring)), h * 3 // 2, w), np.uint8)   # [R, H * 3/2, W] I420
        self._ring = [YuvFrame(b, w, h, matrix) for b in bufs]
        self._pipe = RawVideoPipe(args)

    def __iter__(self) -> Iterator[YuvFrame]:
        while True:
            frame = self._ring[self.count % len(self._ring)]
            try:
                if not self._pipe.read_into(frame.buffer):
                    return
            except TruncatedFrame:
                return     # a cut-off last frame: the frames before it stand
            self.count += 1
            yield frame

    def finish(self) -> None:
        """Wait for ffmpeg to end (plate complete). InputError if it failed or the video is cut short (fewer frames
        than the container's duration declares, or ffmpeg found a partial file); OSError ENOSPC if the plate's
        disk filled up."""
        code, err = self._pipe.wait()
        text = self._pipe.stderr_text()
        if "No space left on device" in text:
            raise OSError(errno.ENOSPC, "No space left on device (writing the plate)")
        if code != 0:
            raise InputError(f"{self.info.path}: video is truncated or corrupt ({err or f'ffmpeg exit {code}'}); "
                             "re-export it")
        if self.max_frames is not None and self.count >= self.max_frames:
            return                                  # stopped early on purpose: the rest was never read
        rate, declared = float(self.info.rate), self.info.duration
        short = self.count < self.info.est_frames - max(3, round(0.5 * rate)) if declared > 0 else False
        if short or "partial file" in text:
            said = f" of the {declared:.2f} s ({self.info.est_frames} frames) its container declares" if declared else ""
            raise InputError(f"{self.info.path}: video is cut short: decoded {self.count} frames "
                             f"({self.count / rate:.2f} s){said}" + ("; ffmpeg: partial file" if "partial file" in text
                                                                     else "") + "; copy or re-export the whole file")

    def close(self) -> None:
        """Stop ffmpeg (if running) and free the pipe."""
        self._pipe.close()

    def __enter__(self) -> "SourceFrames":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
