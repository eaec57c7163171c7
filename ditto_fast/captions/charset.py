"""EIA-608's character set: the basic characters (one byte each, ASCII but for ten places), the special characters
(two bytes, 0x11 0x30..0x3F) and the extended Western European ones (two bytes, 0x12/0x13 0x20..0x3F, sent after a
basic character they replace). Text outside it is mapped to the nearest character it has, or refused."""

from __future__ import annotations

import unicodedata

from ditto_fast.core.errors import UsageError
from ditto_fast.core.files import shown

# the basic set: ASCII 0x20..0x7F, except these codes, which show other characters
_BASIC_SWAPS = {0x2A: "á", 0x5C: "é", 0x5E: "í", 0x5F: "ó", 0x60: "ú", 0x7B: "ç", 0x7C: "÷", 0x7D: "Ñ", 0x7E: "ñ",
                0x7F: "█"}
BASIC = {(_BASIC_SWAPS.get(b) or chr(b)): b for b in range(0x20, 0x80)}
SPECIAL = {ch: 0x30 + i for i, ch in enumerate("®°½¿™¢£♪à\u00a0èâêîôû")}
EXTENDED = {**{ch: (0x12, 0x20 + i) for i, ch in enumerate("ÁÉÓÚÜü‘¡*’—©℠•“”ÀÂÇÈÊËëÎÏïÔÙùÛ«»")},
            **{ch: (0x13, 0x20 + i) for i, ch in enumerate("ÃãÍÌìÒòÕõ{}\\^_|~ÄäÖöß¥¤¦ÅåØø┌┐└┘")}}
# near equivalents for common typography the set lacks
_NEAR = {"Ł": "L", "ł": "l", "Đ": "D", "đ": "d", "Ħ": "H", "ħ": "h", "ı": "i", "Œ": "OE", "œ": "oe", "Æ": "AE",
         "æ": "ae", "Þ": "Th", "þ": "th", "ð": "d", "\u2032": "'",
         "\u2013": "-", "\u2212": "-", "\u2026": "...", "\u00ab": "«", "\u201e": "“",
         "\u2018": "‘", "\u2019": "’", "\t": " "}


def char_codes(ch: str) -> list[tuple[int, int]] | None:
    """The 608 byte pairs (data channel 1, no parity) that put `ch` on screen, or None if the set lacks it. A basic
    character is one byte (paired later); special and extended characters are a control-like pair, an extended one
    preceded by the basic character a decoder without it keeps (the extended code replaces it)."""
    if ch in BASIC:
        return [(BASIC[ch], 0)]
    if ch in SPECIAL:
        return [(0x11, SPECIAL[ch])]
    if ch in EXTENDED:
        fallback = unicodedata.normalize("NFKD", ch)[0]
        fallback = fallback if fallback in BASIC and fallback.isalpha() else "'" if ch in "‘’" else \
            '"' if ch in "“”" else "-" if ch == "—" else " "
        return [(BASIC[fallback], 0), EXTENDED[ch]]
    return None


def check_608(text: str, where: str) -> str:
    """`text` with each character 608 lacks mapped to one it has (typographic quotes and dashes to theirs, a letter
    with an accent 608 lacks to the bare letter); UsageError naming `where` for any other character."""
    out = []
    for ch in text:
        if char_codes(ch) is not None:
            out.append(ch)
            continue
        near = _NEAR.get(ch)
        if near is None:
            bare = "".join(c for c in unicodedata.normalize("NFKD", ch) if not unicodedata.combining(c))
            near = bare if bare and all(char_codes(c) for c in bare) else None
        if near is None:
            raise UsageError(f"{where}: character {shown(ch)} (U+{ord(ch):04X}) has no EIA-608 equivalent; "
                             "replace it in the captions")
        out.append(near)
    return "".join(out)
