"""The 608 captions of a written file, decoded by ffmpeg's cc_dec (not trusting the writer): from an MXF's SMPTE 436M
ANC track (the mxf reader's eia608_extract), a QuickTime c608 track, or the A/53 cc_data in an H.264/HEVC/MPEG-2
stream's SEI or user data (lavfi's movie source, its +subcc output). Any file, not only ours."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import imageio_ffmpeg

from ditto_fast.media.ffpipe import stream_lines

_TIME = r"(\d+):(\d{2}):(\d{2})[,.](\d{3})"
_CUE = re.compile(rf"^{_TIME} --> {_TIME}\s*$")


@dataclass(frozen=True)
class DecodedCaption:
    start: float                        # seconds
    end: float
    text: str                           # rows joined by a space


@dataclass(frozen=True)
class CaptionTrack:
    """What carries a file's captions and what a decoder made of them."""

    carrier: str                        # "SMPTE 436M ANC", "c608 track", "A/53 in the video"
    channel: str                        # CC1 .. (what cc_dec decodes: the first channel with data)
    captions: list[DecodedCaption]


def _seconds(h: str, m: str, s: str, ms: str) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def parse_srt(text: str) -> list[DecodedCaption]:
    """The cues of ffmpeg's SRT output, their text without cc_dec's markup ({\\an7}, <font ...>)."""
    out, lines = [], text.splitlines()
    for i, ln in enumerate(lines):
        m = _CUE.match(ln.strip())
        if not m:
            continue
        body = []
        for t in lines[i + 1:]:
            if not t.strip():
                break
            body.append(re.sub(r"<[^>]*>|\{[^}]*\}", "", t).strip())
        out.append(DecodedCaption(_seconds(*m.groups()[:4]), _seconds(*m.groups()[4:]),
                                  " ".join(b for b in body if b)))
    return out


def _movie_source(path: Path) -> str:
    """`path` escaped for lavfi's movie source inside a filter graph."""
    inner = re.sub(r"([\\':])", r"\\\1", str(path))
    return "movie='" + inner.replace("'", "'\\''") + "'[out+subcc]"


def _first_frames_carry_a53(path: Path, frames: int = 30) -> bool:
    """Whether A/53 caption data (the GA94 identifier) is in the video's first `frames` packets: a quick look before
    decoding the whole picture for them (a caption encoder sends cc_data in every frame, as the embedder does)."""
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-i", str(path),
           "-map", "0:v:0", "-c", "copy", "-frames:v", str(frames), "-f", "data", "-"]
    res = subprocess.run(cmd, capture_output=True)
    return b"GA94" in res.stdout


def read_captions(path: str | Path) -> CaptionTrack | None:
    """The file's 608 captions as ffmpeg's decoder reads them, or None when it carries none."""
    path = Path(path)
    lines = stream_lines(path)
    if any(re.search(r": Subtitle: eia_608", ln) for ln in lines):
        carrier, args = "c608 track", ["-i", str(path), "-map", "0:s:0"]
    elif any(re.search(r": Data: smpte_436m_anc", ln) for ln in lines):
        carrier, args = "SMPTE 436M ANC", ["-eia608_extract", "1", "-i", str(path), "-map", "0:s:0"]
    elif any(re.search(r": Video: (h264|hevc|mpeg2video)\b", ln) for ln in lines) and _first_frames_carry_a53(path):
        # ffmpeg names "Closed Captions" in a stream's line only when its probe decoded some: decode them all
        carrier, args = "A/53 in the video", ["-f", "lavfi", "-i", _movie_source(path), "-map", "0:1"]
    else:
        return None
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", *args, "-f", "srt", "-"]
    res = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    captions = parse_srt(res.stdout) if res.returncode == 0 else []
    if not captions and carrier == "A/53 in the video":
        return None
    return CaptionTrack(carrier, "CC1" if captions else "unreadable", captions)
