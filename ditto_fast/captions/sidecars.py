"""Sidecar caption files beside an output (SCC, WebVTT, SRT, TTML), written by pycaption from the cues, each to a
temporary name and renamed into place."""

from __future__ import annotations

import os
from pathlib import Path

from ditto_fast.captions.cues import Cue
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.media.partfiles import create_locked

SUFFIXES = {"scc": ".scc", "vtt": ".vtt", "srt": ".srt", "ttml": ".ttml"}


def caption_text(cues: list[Cue] | tuple[Cue, ...], kind: str) -> str:
    """The cues as a `kind` file's text (pycaption's writers)."""
    from pycaption import (Caption, CaptionList, CaptionNode, CaptionSet, DFXPWriter, SCCWriter, SRTWriter,
                           WebVTTWriter)

    captions = []
    for cue in cues:
        nodes = []
        for i, row in enumerate(cue.rows):
            if i:
                nodes.append(CaptionNode.create_break())
            nodes.append(CaptionNode.create_text(row))
        captions.append(Caption(round(cue.start * 1e6), round(cue.end * 1e6), nodes))
    writer = {"scc": SCCWriter, "vtt": WebVTTWriter, "srt": SRTWriter, "ttml": DFXPWriter}[kind]()
    return writer.write(CaptionSet({"en-US": CaptionList(captions)}))


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
