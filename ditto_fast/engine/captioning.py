"""The captions of one render, around its writer: the cues (timed text's, or the script's timed from the speech),
the format that carries them (no B frames for SEI, burn-in), the 608 embedded into the finished temporary file
before its QC, the sidecars beside the output, and what the timings JSON says of them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ditto_fast.captions.align import align_words
from ditto_fast.captions.cues import Cue
from ditto_fast.captions.grouping import group_words
from ditto_fast.captions.eia608 import Paced, cue_frame, pace
from ditto_fast.captions.embed import embed
from ditto_fast.captions.plan import captioned_format
from ditto_fast.captions.sidecars import caption_text, write_sidecars
from ditto_fast.engine.clip import Clip


class Captioning:
    """One render's captions (`cues` in the clip's time); use as a `with` block (it owns the burn-in's SRT file)."""

    def __init__(self, clip: Clip, cues: list[Cue]):
        self.clip, self.plan, self.cues = clip, clip.captions, list(cues)
        rate = clip.format.rate if clip.delivery is not None else clip.rate
        frames = clip.frames // 2 if clip.delivery is not None and clip.delivery.video.field_rate else clip.frames
        self.rate = rate
        self.paced: Paced | None = pace(self.cues, rate, frames, self.plan.channel, where=str(self.plan.source)) \
            if self.plan.embed else None
        self._burn: Path | None = None
        if self.plan.burn_in:
            fd, name = tempfile.mkstemp(prefix="ditto-burn-in-", suffix=".srt")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(caption_text(self.cues, "srt"))
            self._burn = Path(name)
        self.sidecars: list[Path] = []

    def __enter__(self) -> "Captioning":
        return self

    def __exit__(self, *exc) -> None:
        if self._burn is not None:
            self._burn.unlink(missing_ok=True)

    def format(self, fmt):
        """The output format as the captions ask it to encode."""
        return captioned_format(fmt, self.plan, self._burn)

    def embed_into(self, path: Path, fmt) -> None:
        """The paced 608 embedded into the finished temporary file `path` (before its QC and rename)."""
        if self.paced is not None:
            embed(path, self.paced, self.rate, fmt.container, fmt.codec, fmt.muxer_args())

    def write_sidecars(self) -> None:
        """The sidecars asked for, beside the (renamed) output."""
        self.sidecars = write_sidecars(self.clip.output, self.cues, self.plan.sidecars)

    def record(self) -> dict:
        """The timings JSON's "captions": source, cues, how carried, where each was put on air."""
        late = [] if self.paced is None else [
            {"cue": n + 1, "cue_frame": cue_frame(c.start, self.rate), "shown_frame": f}
            for n, (c, f) in enumerate(zip(self.cues, self.paced.shown)) if f != cue_frame(c.start, self.rate)]
        return {"source": str(self.plan.source), "timed_by": "file" if self.plan.cues is not None else "alignment",
                "cues": len(self.cues), "embedded": self.plan.embed, "channel": self.plan.channel,
                "burn_in": self.plan.burn_in, "sidecars": [str(p) for p in self.sidecars],
                "shown_late": late}


def needs_alignment(clip: Clip) -> bool:
    """Whether the clip's captions are its script's words, to be timed from the speech."""
    return clip.captions is not None and clip.captions.cues is None


def caption_cues(clip: Clip, char_logp: np.ndarray | None, hubert_dir: Path) -> list[Cue] | None:
    """The clip's cues: its timed text's, or its script's words timed from the speech by CTC alignment on the
    render's HuBERT character head (`char_logp` [T, vocab] at 50 Hz; `hubert_dir` has its vocab.json) and grouped
    into captions; None without captions."""
    plan = clip.captions
    if plan is None:
        return None
    if plan.cues is not None:
        return list(plan.cues)
    timed = align_words(char_logp, plan.words, hubert_dir, where=str(plan.source))
    return group_words(timed, clip.audio.seconds, where=str(plan.source))
