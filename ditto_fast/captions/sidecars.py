"""Sidecar caption files beside an output (SCC, WebVTT, SRT, TTML), each written to a temporary name and renamed
into place: WebVTT, SRT and TTML by pycaption's writers, SCC from the 608 pairs the deliverable carries."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

from ditto_fast.captions.cues import Cue, pycaption
from ditto_fast.captions.eia608 import PAD, cue_frame, pace
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.media.partfiles import create_locked

TTML_NAMESPACES = ('xmlns="http://www.w3.org/ns/ttml" xmlns:tts="http://www.w3.org/ns/ttml#styling" '
                   'xmlns:ttm="http://www.w3.org/ns/ttml#metadata" xmlns:ttp="http://www.w3.org/ns/ttml#parameter"')
NTSC_RATE = Fraction(30000, 1001)       # SCC's time base
SUFFIXES = {"scc": ".scc", "vtt": ".vtt", "srt": ".srt", "ttml": ".ttml"}


def drop_frame_timecode(frame: int) -> str:
    """29.97 drop-frame timecode HH:MM:SS;FF of a frame count (frames 0 and 1 of each minute not divisible by ten
    are skipped)."""
    tens, rest = divmod(frame, 17982)           # frames in ten minutes
    frame += 18 * tens + (2 * ((rest - 2) // 1798) if rest >= 2 else 0)
    return f"{frame // 108000:02d}:{frame // 1800 % 60:02d}:{frame // 30 % 60:02d};{frame % 30:02d}"


def scc_text(cues: list[Cue] | tuple[Cue, ...]) -> str:
    """An SCC file of the cues as the deliverable carries them: the same 608 pairs, paced one a frame at 29.97,
    each run of pairs a line at its first frame's drop-frame timecode (so each caption flips on its cue's frame)."""
    frames = cue_frame(max(c.end for c in cues), NTSC_RATE) + 3
    pairs = pace(list(cues), NTSC_RATE, frames).pairs
    lines, run_start, words = ["Scenarist_SCC V1.0", ""], None, []
    for f, pair in enumerate([*pairs, PAD]):
        if pair != PAD:
            run_start = f if run_start is None else run_start
            words.append(f"{pair[0]:02x}{pair[1]:02x}")
        elif words:
            lines += [f"{drop_frame_timecode(run_start)}\t{' '.join(words)}", ""]
            run_start, words = None, []
    return "\n".join(lines)


def caption_text(cues: list[Cue] | tuple[Cue, ...], kind: str) -> str:
    """The cues as a `kind` file's text (SCC: scc_text; the others pycaption's writers)."""
    if kind == "scc":
        return scc_text(cues)
    pc = pycaption()
    captions = []
    for cue in cues:
        nodes = []
        for i, row in enumerate(cue.rows):
            if i:
                nodes.append(pc.CaptionNode.create_break())
            nodes.append(pc.CaptionNode.create_text(row))
        captions.append(pc.Caption(round(cue.start * 1e6), round(cue.end * 1e6), nodes))
    writer = {"vtt": pc.WebVTTWriter, "srt": pc.SRTWriter, "ttml": pc.DFXPWriter}[kind]()
    text = writer.write(pc.CaptionSet({"en-US": pc.CaptionList(captions)}))
    if kind == "ttml" and "xmlns=" not in text.split(">", 2)[1]:
        # pycaption's writer leaves the root's namespaces out with some BeautifulSoup releases: TTML's own put back
        text = text.replace("<tt ", f"<tt {TTML_NAMESPACES} ", 1)
    return text


def sidecar_path(output: Path, kind: str) -> Path:
    """Where the `kind` sidecar of `output` goes: beside it, its stem and the kind's extension."""
    return output.with_suffix(SUFFIXES[kind])


def write_sidecars(output: Path, cues: list[Cue] | tuple[Cue, ...], kinds: tuple[str, ...]) -> list[Path]:
    """Each of `kinds` written beside `output` (complete or not at all); returns their paths."""
    written = []
    for kind in kinds:
        path = sidecar_path(output, kind)
        tmp, fd = create_locked(path, "part", path.suffix)
        try:
            with os.fdopen(os.dup(fd), "w", encoding="utf-8") as f:
                f.write(caption_text(cues, kind))
            give_usual_mode(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        written.append(path)
    return written
