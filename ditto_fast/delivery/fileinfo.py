"""What a media file holds, read for QC: container, streams and their tags (ffmpeg's reading of the headers), the
MPEG-2 sequence and picture headers parsed here from the stream's own bytes, packet sizes and durations, where
the key frames are. Any file, not only ours."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg

from ditto_fast.core.errors import InputError
from ditto_fast.media.inputs import check_input_file

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe
PACKET_CORRUPT = 0x2                # AV_PKT_FLAG_CORRUPT
NO_PTS = -(1 << 63)                 # AV_NOPTS_VALUE


@dataclass
class Stream:
    index: int
    kind: str                       # video or audio
    codec: str
    detail: str                     # the rest of ffmpeg's stream line
    packets: int = 0
    bytes: int = 0
    seconds: float = 0.0
    corrupt: int = 0                # packets the demuxer flags corrupt (a packet cut short by a truncated file)
    span: float = 0.0               # from the first packet's time to the last one's end (timestamps as stored)


@dataclass
class MediaFacts:
    container: str                  # mxf, mov, mp4, matroska, ...
    timecode: str | None
    streams: list[Stream] = field(default_factory=list)
    keyframe_times: list[float] = field(default_factory=list)   # of the first video stream, seconds
    mpeg2: dict | None = None       # profile_level, progressive_sequence, chroma_format, top_field_first, ...
    declared_seconds: float | None = None   # the container's own duration (its header and index), to 1/100 s

    @property
    def essence_seconds(self) -> float:
        """How long the longest stream's packets last, as stored (their durations, or their times where those
        say more): what the file holds."""
        return max((max(s.seconds, s.span) for s in self.streams), default=0.0)

    @property
    def video(self) -> Stream | None:
        return next((s for s in self.streams if s.kind == "video"), None)

    @property
    def audio(self) -> list[Stream]:
        return [s for s in self.streams if s.kind == "audio"]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([FFMPEG(), "-hide_banner", "-nostdin", *args], capture_output=True)


def read_facts(path: str | Path) -> MediaFacts:
    """Everything QC checks that the file's headers and packets say; InputError for a file ffmpeg cannot read."""
    path = Path(path)
    check_input_file(path, "a video file")
    head = _run(["-i", str(path)]).stderr.decode(errors="replace")
    m = re.search(r"^Input #0, ([^,\n]+)(,[^\n]*)?, from", head, re.M)
    if m is None:
        raise InputError(f"{path}: not a media file ffmpeg can read; give a video file")
    container = m.group(1)
    if container == "mov":                         # ffmpeg reads QuickTime and MP4 alike: the brand tells them apart
        brand = re.search(r"major_brand\s*:\s*(\S+)", head)
        container = "mov" if brand is None or brand.group(1) == "qt" else "mp4"
    tc = re.search(r"timecode\s*:\s*(\d\d:\d\d:\d\d[:;.]\d\d)", head)
    facts = MediaFacts(container, tc.group(1) if tc else None)
    d = re.search(r"^\s*Duration: (\d+):(\d\d):(\d\d(?:\.\d+)?)", head, re.M)
    if d is not None:
        facts.declared_seconds = 3600 * int(d.group(1)) + 60 * int(d.group(2)) + float(d.group(3))
    for sm in re.finditer(r"Stream #0:(\d+)[^:]*: (Video|Audio): (\w+)([^\n]*)", head):
        facts.streams.append(Stream(int(sm.group(1)), sm.group(2).lower(), sm.group(3), sm.group(4)))
    _packets(path, facts)
    if facts.video is not None:
        facts.keyframe_times = _keyframes(path)
        if facts.video.codec == "mpeg2video":
            facts.mpeg2 = _mpeg2_headers(path)
    return facts


def _packets(path: Path, facts: MediaFacts) -> None:
    """Each stream's packet count, bytes, duration (from the packets' own timestamps, as stored) and the packets
    the demuxer flags corrupt (framecrc's F=0x.. with AV_PKT_FLAG_CORRUPT)."""
    out = _run(["-v", "error", "-i", str(path), "-map", "0", "-c", "copy", "-f", "framecrc", "-"]).stdout.decode()
    bases = {int(i): Fraction(int(n), int(d)) for i, n, d in re.findall(r"^#tb (\d+): (\d+)/(\d+)", out, re.M)}
    by_pos = {i: s for i, s in enumerate(facts.streams)}
    first: dict[int, Fraction] = {}
    end: dict[int, Fraction] = {}
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or int(parts[0]) not in by_pos:
            continue
        s = by_pos[int(parts[0])]
        s.packets += 1
        s.bytes += int(parts[4])
        base = bases.get(int(parts[0]), Fraction(0))
        s.seconds += float(int(parts[3]) * base)
        if int(parts[2]) != NO_PTS:
            t = int(parts[2]) * base
            first[s.index] = min(first.get(s.index, t), t)
            end[s.index] = max(end.get(s.index, t), t + int(parts[3]) * base)
            s.span = float(end[s.index] - first[s.index])
        flags = next((p for p in parts[6:] if p.startswith("F=0x")), None)
        if flags is not None and int(flags[4:], 16) & PACKET_CORRUPT:
            s.corrupt += 1


def _keyframes(path: Path) -> list[float]:
    """The times of the first video stream's key frames (only those are decoded)."""
    err = _run(["-skip_frame", "nokey", "-i", str(path), "-map", "0:v:0", "-vf", "showinfo", "-f", "null",
                "-"]).stderr.decode(errors="replace")
    return [float(t) for t in re.findall(r"pts_time:\s*([-\d.]+)", err)]


def _mpeg2_headers(path: Path) -> dict | None:
    """The first picture's MPEG-2 headers, parsed from the stream's bytes: profile and level, chroma format,
    progressive_sequence, the sequence display extension's colour description (None: none), and its picture
    coding extension (picture structure, top_field_first,
    progressive_frame)."""
    data = _run(["-v", "error", "-i", str(path), "-map", "0:v:0", "-c", "copy", "-frames:v", "1", "-f", "data",
                 "-"]).stdout
    found: dict = {}
    for m in re.finditer(b"\x00\x00\x01\xb5", data):
        b = data[m.end():m.end() + 8]
        if len(b) < 5:
            continue
        ext = b[0] >> 4
        if ext == 1 and "profile_level" not in found:          # sequence extension
            found["profile_level"] = ((b[0] & 0x0F) << 4) | (b[1] >> 4)
            found["progressive_sequence"] = (b[1] >> 3) & 1
            found["chroma_format"] = {1: "4:2:0", 2: "4:2:2", 3: "4:4:4"}.get((b[1] >> 1) & 3, "?")
        elif ext == 2 and "colour" not in found:                # sequence display extension
            found["colour"] = None if not b[0] & 1 else \
                {"primaries": b[1], "transfer": b[2], "matrix": b[3]}    # H.273 codes, after a colour_description bit
        elif ext == 8 and "picture_structure" not in found:    # picture coding extension
            bits = int.from_bytes(b[:5], "big")                 # 40 bits; the fields start after 4 + 16 bits

            def at(offset: int, width: int = 1) -> int:
                return (bits >> (40 - offset - width)) & ((1 << width) - 1)
            found["picture_structure"] = {1: "top field", 2: "bottom field", 3: "frame"}.get(at(22, 2), "?")
            found["top_field_first"] = at(24)
            found["progressive_frame"] = at(32)
    return found or None
