"""Channel layouts of a speech file and the rule that mixes them to stereo (ITU-R BS.775 Lo/Ro).

A layout is read as WAVE_FORMAT_EXTENSIBLE's speaker mask (what ffmpeg decodes the file as: its declared
layout, or ffmpeg's default for the channel count); channels come in the order of the mask's bits. The stereo
mix: the front left/right pair (and the left/right-of-centre pair) at 0 dB to their own side, every centre
channel at -3 dB to both sides, every surround, back and height channel at -3 dB to its own side, LFE dropped;
no normalisation (a speech mix sums well below full scale)."""

from __future__ import annotations

import numpy as np

SPEAKERS = ("FL", "FR", "FC", "LFE", "BL", "BR", "FLC", "FRC", "BC", "SL", "SR", "TC", "TFL", "TFC", "TFR",
            "TBL", "TBC", "TBR")        # the mask's bits, lowest first
MINUS_3DB = 0.7071067811865476          # 1 / sqrt(2)
MAX_MIXED = 8                           # 7.1: the most channels mixed to stereo
NAMED = {0x4: "mono", 0x3: "stereo", 0xB: "2.1", 0x7: "3.0", 0x103: "3.0(back)", 0x107: "4.0", 0x33: "quad",
         0x603: "quad(side)", 0xF: "3.1", 0x37: "5.0", 0x607: "5.0(side)", 0x3F: "5.1", 0x60F: "5.1(side)",
         0x13F: "6.1(back)", 0x70F: "6.1", 0x63F: "7.1", 0xFF: "7.1(wide)", 0x6CF: "7.1(wide-side)"}


def speakers(channels: int, mask: int) -> list[str] | None:
    """The speaker of each channel, in order, or None when the mask does not name exactly `channels` of them."""
    names = [name for bit, name in enumerate(SPEAKERS) if mask >> bit & 1]
    return names if len(names) == channels and mask < 1 << len(SPEAKERS) else None


def layout_name(channels: int, mask: int) -> str:
    """A layout's usual name (5.1, 7.1, ...), its speakers, or the bare channel count."""
    names = speakers(channels, mask)
    if names is None:
        return f"{channels}-channel"
    return NAMED.get(mask, "+".join(names))


def stereo_mix(names: list[str]) -> np.ndarray:
    """The stereo mix [2, C] of channels with these speakers: row 0 is the left output, row 1 the right."""
    mix = np.zeros((2, len(names)))
    for c, name in enumerate(names):
        if name == "LFE":
            continue
        if name in ("FL", "FLC"):
            mix[0, c] = 1.0
        elif name in ("FR", "FRC"):
            mix[1, c] = 1.0
        elif name.endswith("C"):                # FC, BC, TC, TFC, TBC: the middle, to both sides
            mix[:, c] = MINUS_3DB
        else:                                   # surrounds, backs, heights: BL, SL, TFL, TBL and their right
            mix[0 if name.endswith("L") else 1, c] = MINUS_3DB
    return mix


__all__ = ["MAX_MIXED", "MINUS_3DB", "layout_name", "speakers", "stereo_mix"]
