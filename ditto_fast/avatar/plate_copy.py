"""The plate as shot: where registration reads a video's frames unchanged, the plate is the source's own video
stream, copied into plate.mp4 (no generation at all), and checked to decode, block by block as renders read it, to
exactly the frames registration read. Otherwise, or where that check fails, the plate is encoded (plate.py).

Unchanged means: no scaling (the picture's display size is kept and is the stored size), no deinterlacing, tone
mapping, range, rate or layout conversion (the stream's pixel format is one a plate keeps), no quarter-turn, and
BT.709 (the matrix the plate reader takes as it is; an untagged HD stream is tagged BT.709 in its headers by a
bitstream filter, its pictures untouched). The stream must be H.264 or HEVC, which MP4 carries and which those
filters tag, and its keyframes at most COPY_MAX_KEYINT frames apart (each block a render reads seeks to the
keyframe before it and decodes from there).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import imageio_ffmpeg

from ditto_fast.avatar.plate import PlateReader, plate_encoding
from ditto_fast.avatar.source import encode_plate
from ditto_fast.core.errors import AvatarError
from ditto_fast.media.yuv import LAYOUTS

if TYPE_CHECKING:
    from ditto_fast.avatar.source import SourceInfo

SUMS_NAME = ".frames.md5"       # beside the plate while registration runs: the MD5 of each frame it read
# codecs a plate may copy -> the bitstream filter that tags their colour matrix
COPY_TAGGERS = {"h264": "h264_metadata", "hevc": "hevc_metadata"}
BT709_MATRIX = 1                # matrix_coefficients of BT.709 in H.264/HEVC headers
# the most frames between a copied stream's keyframes: a render's block of PLATE_KEYINT frames seeks to the keyframe
# before it, so it decodes up to this many frames more (a phone's 1 s GOP at 60 fps, 2 s at 30)
COPY_MAX_KEYINT = 60


def copy_refusal(info: SourceInfo) -> str | None:
    """Why the plate cannot be `info`'s own video stream copied (None: it can): what registration changes as it
    reads the frames, or what a copy cannot carry."""
    p, (w, h) = info.picture, info.size
    checks = [
        (info.codec not in COPY_TAGGERS, f"its video is {info.codec or 'of unknown codec'}, not H.264 or HEVC"),
        (info.turned, "a rotation tag turns it"),
        (info.size != info.src_size or p.sar != 1, f"it is scaled to {w}x{h} with square pixels"),
        (bool(p.fields), "it is interlaced (deinterlaced as it is read)"),
        (bool(p.hdr), f"it is HDR ({p.hdr}), tone-mapped as it is read"),
        (p.pix_fmt not in LAYOUTS, f"its pixels ({p.pix_fmt}) are converted to {p.plate_layout.pix_fmt}"),
        (p.full_range, "it is full range (brought to limited range as it is read)"),
        (p.kept_matrix != "bt709", f"it is {p.kept_matrix}, not BT.709"),
        (bool(info.rate_note), "its frame rate varies"),
    ]
    return next((why for refused, why in checks if refused), None)


def copy_stream(info: SourceInfo, plate: str | Path, max_frames: int | None = None) -> str | None:
    """Copy `info`'s video stream into `plate` (MP4, tagged BT.709 where the source is untagged; its first
    `max_frames` frames and maybe a few more when given); None when done, else why not, with nothing left at
    `plate`."""
    plate = Path(plate)
    cut = ["-t", _seconds(Fraction(int(max_frames)) / info.rate)] if max_frames is not None else []
    tag = [] if info.colorspace == "bt709" else ["-bsf:v", f"{COPY_TAGGERS[info.codec]}=matrix_coefficients={BT709_MATRIX}"]
    args = ["-y", "-i", str(info.path),
            "-map", "0:v:0", "-c:v", "copy", *tag, *cut, "-map_metadata", "-1", "-map_metadata:s:v", "-1",
            "-map_chapters", "-1", "-movflags", "+faststart", "-f", "mp4", str(plate),
            "-map", "0:v:0", "-c:v", "copy", *cut, "-f", "framecrc", "pipe:1"]        # each packet: its flags
    res = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", *args],
                         capture_output=True, text=True, errors="replace")
    packets = [ln for ln in res.stdout.splitlines() if ln and not ln.startswith("#")]
    keys = [i for i, ln in enumerate(packets) if _is_key(ln)]
    gap = max((b - a for a, b in zip(keys, [*keys[1:], len(packets)])), default=0)
    why = None
    if res.returncode != 0 or not keys:
        last = res.stderr.strip().splitlines()[-1][:160] if res.stderr.strip() else "no keyframe"
        why = f"ffmpeg could not copy its stream ({last})"
    elif gap > COPY_MAX_KEYINT:
        why = f"its keyframes are up to {gap} frames apart, more than the {COPY_MAX_KEYINT} a copy may have"
    if why is not None:
        plate.unlink(missing_ok=True)
    return why


def _is_key(packet: str) -> bool:
    """Whether a framecrc packet line is a keyframe's (framecrc writes the flags only when they are not just "key")."""
    flags = re.search(r"F=0x([0-9A-Fa-f]+)", packet)
    return flags is None or bool(int(flags.group(1), 16) & 1)


def _seconds(t: Fraction) -> str:
    """`t` in seconds for ffmpeg's -t, rounded up to the microsecond."""
    us = -(-t.numerator * 1_000_000 // t.denominator)
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def read_frame_sums(path: str | Path) -> list[str]:
    """The MD5 of each frame in an ffmpeg framemd5 file, in order."""
    return [ln.rsplit(",", 1)[1].strip() for ln in Path(path).read_text().splitlines() if ln and not ln.startswith("#")]


def copy_mismatch(plate: str | Path, frame_sums: str | Path, frames: int, info: SourceInfo) -> str | None:
    """Why the copied `plate` does not decode to the `frames` frames registration read, whose MD5s (in the plate's
    layout) are in `frame_sums` (None: every one is the same). It is read as renders read it: block by block, each
    block by its own seek."""
    want = read_frame_sums(frame_sums)
    if len(want) < frames:
        return f"registration read {frames} frames but summed {len(want)}"
    try:
        with PlateReader(plate, frames, pix_fmt="planes", order=range(frames)) as reader:
            if (reader.size, reader.layout, reader.matrix) != (tuple(info.size), info.picture.plate_layout, "bt709"):
                return (f"it reads as {reader.size[0]}x{reader.size[1]} {reader.layout.pix_fmt} {reader.matrix}, not "
                        f"{info.size[0]}x{info.size[1]} {info.picture.plate_layout.pix_fmt} bt709")
            for k in range(frames):
                if hashlib.md5(reader.frame(k)).hexdigest() != want[k]:
                    return f"its frame {k} decodes to other pixels than registration read"
    except AvatarError as exc:
        return str(exc)
    return None


@dataclass
class PlatePlan:
    """How registration makes a video's plate at `path`: copied (registration then writes its frames' MD5s to
    `sums`, to check the copy by) or encoded in registration's pass (`sums` None). `how` is what the record says."""

    path: Path
    how: str
    sums: Path | None = None

    @property
    def encode_to(self) -> Path | None:
        """Where registration's pass encodes the plate (None: it is copied)."""
        return None if self.sums is not None else self.path

    def finish(self, info: SourceInfo, frames: int) -> str | None:
        """After registration's pass over `frames` frames: check a copy against them; one that does not decode to
        them is replaced by a plate encoded from the source, and the note saying so is returned (else None)."""
        if self.sums is None:
            return None
        why = copy_mismatch(self.path, self.sums, frames, info)
        self.sums.unlink(missing_ok=True)
        self.sums = None
        if why is None:
            return None
        encode_plate(info, self.path, frames)
        encoded = plate_encoding(info.picture.plate_layout)
        self.how = f"{encoded} (a copy of the source's stream did not read back: {why})"
        return f"{info.path}: the plate could not be the source's own stream ({why}); it is {encoded} instead"


def plan_plate(info: SourceInfo, path: str | Path, max_frames: int | None = None) -> PlatePlan:
    """The plate of video source `info` at `path`: its stream copied there now where it can be, else to encode."""
    path = Path(path)
    why = copy_refusal(info) or copy_stream(info, path, max_frames)
    if why is None:
        return PlatePlan(path, f"the source's own {info.codec} stream, copied", path.with_name(SUMS_NAME))
    return PlatePlan(path, f"{plate_encoding(info.picture.plate_layout)} (not copied: {why})")
