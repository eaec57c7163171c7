"""How a video source's picture is read: its pixel aspect, its colour matrix (as tagged, or by size as HD practice
does when untagged), and HDR (PQ or HLG) tone-mapped to SDR BT.709, as the ffmpeg filter chain registration
decodes it with and the notes it tells the user.

Everything registration keeps is square-pixel SDR BT.709 or BT.601 at the source's display size: an anamorphic
source (HDV 1440x1080 at 4:3, PAL 720x576 at 64:45) is widened to its display size before the face is looked
at, so landmarks, crop and networks see the face as it is seen on air, and the output has square pixels at
that size (it displays at the source's aspect in any player). Untagged sources are BT.709 from 1280x720 up and
BT.601 below (ffmpeg's own rule is BT.601 for all); `--source-colour` says otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from ditto_fast.core.config import SOURCE_COLOURS
from ditto_fast.media.ffpipe import colorspace_tag, pixel_format
from ditto_fast.media.rates import rate_text
from ditto_fast.media.yuv import COLORSPACE_TAG, Layout, layout_for, matrix_for_tag

HD = (1280, 720)                    # from this size up an untagged picture is taken as BT.709
HDR_TRANSFERS = {"smpte2084": "PQ", "arib-std-b67": "HLG"}
# HDR reference white (BT.2408: 203 cd/m2, also HLG's 75 % signal) becomes SDR white; what is brighter rolls off
# (mobius), so faces and the set keep the levels they were graded at
REFERENCE_WHITE_NITS = 203
TONE_MAP = "mobius:param=0.5"   # linear up to half of reference white (faces, the set), rolled off above
_NAMES = {"bt601": "BT.601", "bt709": "BT.709", "bt2020": "BT.2020", "smpte240m": "SMPTE 240M", "fcc": "FCC"}


@dataclass(frozen=True)
class Picture:
    """A video stream's picture: the matrix its pixels are in, whether that was assumed, its transfer and primaries
    tags, and its sample aspect ratio."""

    matrix: str                     # yuv.py's name: bt601, bt709, bt2020, ...
    assumed: str | None = None      # why the matrix is not the tag's: "size" (untagged) or "asked" (--source-colour)
    transfer: str | None = None     # the transfer tag (smpte2084, arib-std-b67, bt709, ...), None if untagged
    primaries: str | None = None
    sar: Fraction = Fraction(1)
    pix_fmt: str | None = None      # the stream's pixel format (yuv422p10le, ...)
    fields: str | None = None       # "tff" or "bff" for an interlaced stream (deinterlaced as it is read)
    full_range: bool = False        # full-range levels ("pc", yuvj): brought to limited range as it is read

    @property
    def plate_layout(self) -> Layout:
        """The planes the plate keeps: the source's chroma up to 4:2:2 and its depth up to 10 bits."""
        return layout_for(self.pix_fmt)

    @property
    def hdr(self) -> str | None:
        """"PQ" or "HLG" for an HDR transfer, else None."""
        return HDR_TRANSFERS.get(self.transfer or "")

    @property
    def kept_matrix(self) -> str:
        """The matrix of what registration keeps (BT.709 after a tone map)."""
        return "bt709" if self.hdr else self.matrix

    def display_size(self, stored: tuple[int, int]) -> tuple[int, int]:
        """(w, h) with square pixels: the stored width times the sample aspect ratio."""
        w, h = stored
        return max(2, round(w * self.sar)), h

    def filter_chain(self, size: tuple[int, int], rate: Fraction) -> str:
        """ffmpeg's filters from the stream to limited-range YUV in the plate's layout at `size` (square pixels),
        `rate`, in kept_matrix and tagged so."""
        w, h = size
        out = self.plate_layout.pix_fmt
        # an interlaced source (1080i) is deinterlaced first, one frame per frame (bwdif, motion-adaptive): no
        # combing reaches the plate, the landmarks or the crops
        steps = [f"bwdif=mode=send_frame:parity={self.fields}:deint=all"] if self.fields else []
        steps.append(f"fps={rate_text(rate)}")
        if self.hdr:        # to linear light, BT.709 primaries, tone-mapped, then BT.709 SDR
            tin = self.transfer
            pin = self.primaries if self.primaries and self.primaries != "unknown" else "bt2020"
            steps += [f"zscale=tin={tin}:min={COLORSPACE_TAG[self.matrix]}:pin={pin}:t=linear:"
                      f"npl={REFERENCE_WHITE_NITS}",
                      "format=gbrpf32le", "zscale=p=bt709", f"tonemap=tonemap={TONE_MAP}:desat=0",
                      "zscale=t=bt709:m=bt709:r=tv", f"format={out}"]
        given = f"in_color_matrix={self.kept_matrix}:" if self.assumed or self.hdr else ""
        steps.append(f"scale={w}:{h}:flags=area:{given}out_color_matrix={self.kept_matrix}:out_range=tv")
        if self.sar != 1:
            steps.append("setsar=1")
        tags = f"colorspace={COLORSPACE_TAG[self.kept_matrix]}"
        if self.hdr:
            tags += ":color_primaries=bt709:color_trc=bt709"
        steps += [f"setparams={tags}:range=tv", f"format={out}"]
        return ",".join(steps)

    def notes(self, path: object, stored: tuple[int, int], size: tuple[int, int], max_size: int) -> list[str]:
        """What registration tells the user about this picture (one line each)."""
        out = []
        if self.assumed == "size":
            hd = "an HD picture is" if self.matrix == "bt709" else "a picture below 1280x720 is"
            other = "bt601" if self.matrix == "bt709" else "bt709"
            out.append(f"{path}: colour matrix not tagged; took {_NAMES[self.matrix]}, as {hd} "
                       f"({stored[0]}x{stored[1]}); say --source-colour {other} if it is not")
        if self.hdr:
            out.append(f"{path}: HDR ({self.hdr}, {self.primaries or 'bt2020'} primaries) tone-mapped to SDR BT.709 "
                       f"(reference white {REFERENCE_WHITE_NITS} cd/m2 to SDR white, highlights rolled off by "
                       f"{TONE_MAP.split(':')[0]}); the avatar and its renders are SDR")
        if self.sar != 1:
            shown = self.display_size(stored)
            out.append(f"{path}: anamorphic ({stored[0]}x{stored[1]}, pixel aspect {self.sar.numerator}:"
                       f"{self.sar.denominator}); registered with square pixels at {shown[0]}x{shown[1]} (display "
                       "aspect kept)")
        if self.fields:
            out.append(f"{path}: interlaced ({'top' if self.fields == 'tff' else 'bottom'} field first); "
                       "deinterlaced (bwdif, a frame per frame) as it is registered")
        shown = self.display_size(stored)
        if size[0] < shown[0] - 1 or size[1] < shown[1] - 1:
            out.append(f"{path}: registered at {size[0]}x{size[1]} from {shown[0]}x{shown[1]} (max size {max_size}); "
                       f"--max-size {max(shown)} keeps the full size")
        return out

    def record(self) -> dict:
        """The picture as the avatar records it (plain values)."""
        return {"matrix": self.matrix, "assumed": self.assumed, "transfer": self.transfer,
                "primaries": self.primaries, "sar": f"{self.sar.numerator}:{self.sar.denominator}",
                "pix_fmt": self.pix_fmt, "plate": self.plate_layout.pix_fmt,
                "tone_mapped": self.hdr, "kept_matrix": self.kept_matrix,
                **({"deinterlaced": self.fields} if self.fields else {})}


def read_picture(line: str, stored: tuple[int, int], source_colour: str = "auto") -> Picture:
    """The picture of the stream ffmpeg describes in `line` ("Video: hevc ..., yuv420p10le(tv, bt2020nc/bt2020/
    smpte2084), 3840x2160 [SAR 1:1 DAR 16:9], ..."); `source_colour` (one of SOURCE_COLOURS) other than auto
    overrides the matrix."""
    if source_colour not in SOURCE_COLOURS:
        raise ValueError(f"source_colour must be one of {', '.join(SOURCE_COLOURS)}, got {source_colour!r}")
    tag = colorspace_tag(line)
    primaries, transfer = _primaries_transfer(line)
    sar, fmt = _sar(line), pixel_format(line)
    fields = "tff" if "top first" in line else "bff" if "bottom first" in line else None
    full = (fmt or "").startswith("yuvj") or bool(re.search(r"Video: [^,]+(?:\([^)]*\))*, [\w-]+\(pc\b", line))
    if source_colour != "auto":
        return Picture(source_colour, "asked", transfer, primaries, sar, fmt, fields, full)
    if tag is None:
        hd = stored[0] >= HD[0] or stored[1] >= HD[1]
        return Picture("bt709" if hd else "bt601", "size", transfer, primaries, sar, fmt, fields, full)
    return Picture(matrix_for_tag(tag), None, transfer, primaries, sar, fmt, fields, full)


def _primaries_transfer(line: str) -> tuple[str | None, str | None]:
    """The primaries and transfer tags of "(tv, bt2020nc/bt2020/smpte2084, progressive)"; None where not given."""
    m = re.search(r"\((?:tv|pc)?,? ?[\w-]+/([\w-]+)/([\w-]+)", line)
    if not m:
        return None, None
    clean = [None if v in ("unknown", "reserved") else v for v in m.groups()]
    return clean[0], clean[1]


def _sar(line: str) -> Fraction:
    """The sample aspect ratio in "[SAR 4:3 DAR 16:9]" (1 when absent or 0:1)."""
    m = re.search(r"\[SAR (\d+):(\d+) DAR", line)
    if not m or int(m.group(1)) == 0 or int(m.group(2)) == 0:
        return Fraction(1)
    return Fraction(int(m.group(1)), int(m.group(2)))
