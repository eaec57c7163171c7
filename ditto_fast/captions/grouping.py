"""Timed words grouped into caption cues as captioners group them: at most ROWS rows of COLUMNS characters, a cue
closed at a sentence's end and, once it holds a row, at a phrase's (a comma, a colon, a dash), each on screen
long enough to read (READ_CPS characters a second, MIN_SECONDS at least) and until the next one replaces it.
A cue starts with its first word, or later when the one before still needs reading time (or 608 its loading time):
captions then trail the speech a little, never flash by. Every cue lies inside the audio."""

from __future__ import annotations

import re

from ditto_fast.captions.align import TimedWord
from ditto_fast.captions.cues import COLUMNS, ROWS, Cue, wrap_rows
from ditto_fast.captions.eia608 import load_pairs
from ditto_fast.core.errors import UsageError

READ_CPS = 20.0                 # characters a second a viewer reads (broadcast captioning's usual ceiling)
MIN_SECONDS = 1.0               # the shortest a caption stays up (when the speech leaves time for it)
LOAD_RATE = 24                  # frames/s of the slowest output: 608 loads one byte pair a frame
SENTENCE_END = re.compile(r"[.?!…]['\"”’)]*$")
PHRASE_END = re.compile(r"[,;:—–-]['\"”’)]*$")


def _fits(words: list[str]) -> bool:
    """Whether the words fill at most ROWS rows of COLUMNS characters, broken at spaces."""
    rows = [""]
    for w in words:
        if not rows[-1]:
            rows[-1] = w
        elif len(rows[-1]) + 1 + len(w) <= COLUMNS:
            rows[-1] += " " + w
        else:
            rows.append(w)
    return len(rows) <= ROWS and all(len(r) <= COLUMNS for r in rows)


def _pieces(words: list[TimedWord]) -> list[TimedWord]:
    """Words longer than a row cut into row-long pieces sharing the word's time evenly."""
    out = []
    for w in words:
        if len(w.text) <= COLUMNS:
            out.append(w)
            continue
        parts = [w.text[i:i + COLUMNS] for i in range(0, len(w.text), COLUMNS)]
        step = (w.end - w.start) / len(parts)
        out += [TimedWord(p, w.start + k * step, w.start + (k + 1) * step) for k, p in enumerate(parts)]
    return out


def load_seconds(text: str) -> float:
    """How long 608 takes, one pair a frame at LOAD_RATE, to load a pop-on caption of `text` after the caption before
    it flipped (its end-of-caption twice), a frame more for rounding times to frames."""
    return (2 + len(load_pairs(wrap_rows(text, "the script"))) + 1) / LOAD_RATE


def group_words(words: list[TimedWord], audio_seconds: float, where: str = "the script") -> list[Cue]:
    """Cues of whole words, in order, each of at most ROWS x COLUMNS characters, inside [0, audio_seconds];
    UsageError naming `where` (the script's file) when the speech cannot show them all."""
    groups: list[list[TimedWord]] = []
    current: list[TimedWord] = []
    for w in _pieces(words):
        if current and not _fits([x.text for x in current] + [w.text]):
            groups.append(current)
            current = []
        current.append(w)
        length = len(" ".join(x.text for x in current))
        if SENTENCE_END.search(w.text) or (PHRASE_END.search(w.text) and length > COLUMNS):
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    texts = [" ".join(x.text for x in g) for g in groups]
    starts: list[float] = []
    for i, g in enumerate(groups):      # a cue waits for the one before to be read, and for its own loading
        start = max(g[0].start, (starts[-1] if i else 0.0) + load_seconds(texts[i]))
        if i:
            start = max(start, starts[-1] + max(MIN_SECONDS, len(texts[i - 1]) / READ_CPS))
        starts.append(start)
    latest = audio_seconds - 2 / LOAD_RATE          # its end-of-caption, twice, inside the clip
    for i in range(len(starts) - 1, -1, -1):    # none past the audio: the last ones drawn back, each after the
        starts[i] = min(starts[i], latest)      # time 608 takes to load it
        latest = starts[i] - load_seconds(texts[i])
    if starts and starts[0] < load_seconds(texts[0]) - 1e-9:
        raise UsageError(f"{where}: the script makes {len(groups)} captions, more than {audio_seconds:.2f} s of "
                         "speech can show; give the words this audio reads")
    out = []
    for i, g in enumerate(groups):
        text = " ".join(x.text for x in g)
        wanted = starts[i] + max(MIN_SECONDS, len(text) / READ_CPS, g[-1].end - starts[i])
        end = min(wanted, starts[i + 1] if i + 1 < len(groups) else audio_seconds)
        out.append(Cue(starts[i], end, wrap_rows(text, where)))
    return out
