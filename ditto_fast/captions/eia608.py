"""EIA-608 pop-on captions paced as a caption encoder paces them: one byte pair per frame (field 1, data channel
CC1 or CC2), every frame carrying a pair (0x80 0x80 when nothing is sent). Each caption is loaded into the
non-displayed memory ahead of its cue (resume caption loading, erase it, a preamble per row, the characters) and
flipped on screen by end-of-caption on its cue's frame; a caption followed by a gap is erased on its end's frame.
Control codes, special and extended characters are sent twice (decoders drop the repeat), as broadcast practice."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ditto_fast.captions.charset import char_codes
from ditto_fast.captions.cues import Cue
from ditto_fast.core.errors import UsageError

CHANNELS = ("CC1",)                   # field 1, data channel 1: what cc_dec and most decoders show
PAD = (0x80, 0x80)                      # the null pair (0x00 0x00 with odd parity)
RCL, EOC, EDM, ENM = 0x20, 0x2F, 0x2C, 0x2E     # misc control codes (second byte, after 0x14 / 0x1C)
# preamble address codes, white, column 0: bottom row (15) and the one above (14)
PAC_ROW = {14: (0x14, 0x40), 15: (0x14, 0x60)}


def odd_parity(byte: int) -> int:
    """`byte` (7 bits) with bit 7 set so that the byte has an odd number of ones."""
    byte &= 0x7F
    return byte | (0x80 if bin(byte).count("1") % 2 == 0 else 0)


def _pair(b1: int, b2: int) -> tuple[int, int]:
    return odd_parity(b1), odd_parity(b2)


def _on_channel(first: int, channel: str) -> int:
    """A control or two-byte character's first byte on `channel` (CC2 sets bit 3)."""
    return first | 0x08 if channel == "CC2" else first


def control(code: int, channel: str) -> list[tuple[int, int]]:
    """A misc control code, twice."""
    p = _pair(_on_channel(0x14, channel), code)
    return [p, p]


def load_pairs(rows: tuple[str, ...], channel: str = "CC1") -> list[tuple[int, int]]:
    """The pairs that load one pop-on caption of `rows` into non-displayed memory (without the end-of-caption)."""
    out = control(RCL, channel) + control(ENM, channel)
    for row, text in zip((15,) if len(rows) == 1 else (14, 15), rows):
        first, second = PAC_ROW[row]
        pac = _pair(_on_channel(first, channel), second)
        out += [pac, pac]
        pending: list[int] = []             # basic characters waiting for a partner byte
        for ch in text:
            codes = char_codes(ch)
            if codes is None:
                raise ValueError(f"{ch!r} is not in EIA-608's set (captions/charset.check_608 maps text first)")
            for b1, b2 in codes:
                if b1 >= 0x20:              # a basic character: one byte
                    pending.append(b1)
                    if len(pending) == 2:
                        out.append(_pair(*pending))
                        pending = []
                    continue
                if pending:
                    out.append(_pair(pending[0], 0))
                    pending = []
                p = _pair(_on_channel(b1, channel), b2)
                out += [p, p]
        if pending:
            out.append(_pair(pending[0], 0))
    return out


class _NoRoom(Exception):
    """No free frame left before the clip's end."""


@dataclass(frozen=True)
class Paced:
    """The 608 stream of a clip: a pair per frame, and the frame each cue is shown on and cleared on (or None)."""

    pairs: list[tuple[int, int]]        # [frames]
    shown: list[int]                    # per cue
    cleared: list[int | None]           # per cue: its erase frame (None: the next caption replaced it)


def cue_frame(seconds: float, rate: Fraction) -> int:
    """The frame a time falls on: the nearest frame start."""
    return int(round(seconds * rate))


def pace(cues: list[Cue], rate: Fraction, frames: int, channel: str = "CC1", where: str = "captions") -> Paced:
    """Every cue loaded ahead into free frames after the previous caption's flip and shown by end-of-caption on its
    cue's frame (or the first frame after its loading, when the cues before leave no room); UsageError naming
    `where` (the captions' file) for a cue the clip ends before it can be shown: the cues before it come faster than
    608 carries them (each was shown late, and the lateness grew), or it starts too near the clip's end."""
    if channel not in CHANNELS:
        raise UsageError(f"caption channel {channel!r}: use one of {', '.join(CHANNELS)}")
    slots: list[tuple[int, int] | None] = [None] * frames
    shown: list[int] = []
    cleared: list[int | None] = []

    def put(f: int, pairs: list[tuple[int, int]]) -> tuple[int, int]:
        """`pairs` in the free frames from `f` on; (frame of the first, frame of the last); _NoRoom past the end."""
        placed = []
        for p in pairs:
            while f < frames and slots[f] is not None:
                f += 1
            if f >= frames:
                raise _NoRoom
            slots[f] = p
            placed.append(f)
            f += 1
        return placed[0], placed[-1]

    floor = 0                           # the first frame after the previous flip: non-displayed memory is free
    late_from: int | None = None        # the first of the cues shown late one after another, up to this one
    for n, cue in enumerate(cues):
        start, end = cue_frame(cue.start, rate), cue_frame(cue.end, rate)
        try:
            _, last = put(floor, load_pairs(cue.rows, channel))
            flip, _ = put(max(start, last + 1), control(EOC, channel))
        except _NoRoom:
            text = f"cue {n + 1} ({' '.join(cue.rows)[:40]!r})"
            if late_from is not None and floor > start:
                raise UsageError(
                    f"{where}: cues {late_from + 1} to {n + 1} come faster than EIA-608 carries them (one byte pair, "
                    f"two characters, a frame: at {float(rate):g} frames/s each was shown later than its time, "
                    f"{shown[-1] - cue_frame(cues[n - 1].start, rate)} frames late by cue {n}), so {text} cannot "
                    "be shown before the clip ends; merge or shorten those cues, or space them out") from None
            raise UsageError(f"{where}: {text} starts too near the clip's end for 608 to load and show it "
                             f"({len(load_pairs(cue.rows, channel)) + 2} frames); end the captions earlier") from None
        late_from = (n if late_from is None else late_from) if flip > start else None
        shown.append(flip)
        floor = flip + 2
        following = cue_frame(cues[n + 1].start, rate) if n + 1 < len(cues) else None
        if following is not None and following <= end + 1:
            cleared.append(None)            # the next caption's flip replaces it
            continue
        at = min(max(end, flip + 2), frames - 2)
        try:
            cleared.append(put(at, control(EDM, channel))[0] if at > flip else None)
        except _NoRoom:
            cleared.append(None)            # the clip ends first
    return Paced([s or PAD for s in slots], shown, cleared)
