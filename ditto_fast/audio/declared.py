"""The length an audio file's header declares (WAV/RF64, AIFF/AIFC, FLAC), read from the header alone, so a file
cut short in transfer can be told from a short recording. Other formats, and headers that declare no length
(a streaming writer's 0xFFFFFFFF, FLAC's 0 total samples, compressed WAV data), give None."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

_MAX_CHUNKS = 4096                              # a header is a handful of chunks; a mutated one may loop
_WAV_PCM_TAGS = {1, 3, 6, 7}                    # PCM, IEEE float, A-law, mu-law: data bytes / block align = frames
_WAV_EXTENSIBLE = 0xFFFE
_AIFC_PLAIN = {b"NONE", b"sowt", b"twos", b"raw ", b"in24", b"in32", b"fl32", b"FL32", b"fl64", b"FL64",
               b"alaw", b"ALAW", b"ulaw", b"ULAW"}   # numSampleFrames counts frames (not packets) for these


def declared_seconds(path: Path) -> float | None:
    """Seconds of audio the header of the WAV, AIFF or FLAC file at `path` declares, or None (not one of them, or
    no length declared)."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            if head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] == b"WAVE":
                return _wav(f)
            if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
                return _aiff(f, head[8:12] == b"AIFC")
            f.seek(0)
            return _flac(f)
    except (OSError, struct.error, ValueError, OverflowError, ZeroDivisionError):
        return None


def _chunks(f: BinaryIO, order: str):
    """(id, size, offset of the body) of each chunk from the current position, the next one found by seeking."""
    for _ in range(_MAX_CHUNKS):
        head = f.read(8)
        if len(head) < 8:
            return
        cid, size = head[:4], struct.unpack(order + "I", head[4:])[0]
        body = f.tell()
        yield cid, size, body
        f.seek(body + size + (size & 1))


def _wav(f: BinaryIO) -> float | None:
    rate = align = tag = 0
    ds64_data = None
    for cid, size, body in _chunks(f, "<"):
        if cid == b"ds64":                      # RF64: the real data size when the data chunk says 0xFFFFFFFF
            ds64_data = struct.unpack("<Q", f.read(16)[8:16])[0]
        elif cid == b"fmt ":
            fmt = f.read(min(size, 40))
            tag, _channels, rate, _byte_rate, align = struct.unpack("<HHIIH", fmt[:14])
            if tag == _WAV_EXTENSIBLE and len(fmt) >= 26:
                tag = struct.unpack("<H", fmt[24:26])[0]   # the sub-format GUID starts with the format tag
        elif cid == b"data":
            if size == 0xFFFFFFFF:
                size = ds64_data
            if not size or not rate or not align or tag not in _WAV_PCM_TAGS:
                return None
            return size // align / rate
    return None


def _extended(b: bytes) -> float:
    """An 80-bit IEEE 754 extended float (AIFF's sample rate)."""
    exp, mantissa = struct.unpack(">HQ", b)
    sign = -1.0 if exp & 0x8000 else 1.0
    exp &= 0x7FFF
    return 0.0 if exp == 0 and mantissa == 0 else sign * mantissa * 2.0 ** (exp - 16383 - 63)


def _aiff(f: BinaryIO, aifc: bool) -> float | None:
    for cid, size, body in _chunks(f, ">"):
        if cid == b"COMM":
            comm = f.read(min(size, 22))
            frames = struct.unpack(">I", comm[2:6])[0]
            rate = _extended(comm[8:18])
            if aifc and comm[18:22] not in _AIFC_PLAIN:
                return None
            return frames / rate if frames and rate > 0 else None
    return None


def _flac(f: BinaryIO) -> float | None:
    head = f.read(10)
    if head[:3] == b"ID3" and len(head) == 10:   # an ID3v2 tag before the stream: its size is syncsafe
        size = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | (head[9] & 0x7F)
        f.seek(10 + size + (10 if head[5] & 0x10 else 0))
    else:
        f.seek(0)
    head = f.read(4 + 4 + 18)                   # "fLaC", the first block's header, STREAMINFO up to total samples
    if head[:4] != b"fLaC" or head[4] & 0x7F != 0 or len(head) < 26:
        return None
    bits = int.from_bytes(head[18:26], "big")    # rate 20 | channels-1 3 | bits-1 5 | total samples 36
    rate, total = bits >> 44, bits & ((1 << 36) - 1)
    return total / rate if total and rate else None


__all__ = ["declared_seconds"]
