"""Paced 608 pairs put into a finished file, as the receiving chain reads them, by a remux beside it (the picture and
sound are copied, not encoded again):
  MXF (MPEG-2 XDCAM, DNxHD)   CDPs in an SMPTE 436M ANC track (ffmpeg's mxf muxer, from eia_608 packets: one per
                              frame, which the muxer lays one per edit unit)
  QuickTime with ProRes       a c608 track (eia_608 packets, one per frame, at each frame's time)
  H.264 / HEVC (MP4, MOV, MKV) A/53 cc_data in each access unit's SEI (user data registered by ITU-T T.35, GA94),
                              field 1 carrying the pair, field 2 a null pair; the stream is encoded without B frames
                              (`embeds_in_sei`), so each access unit is its frame
The eia_608 packets reach ffmpeg through its SCC reader, one line per frame at the frame's time (that reader counts a
timecode's frames as 33 ms: the line's timecode is chosen so that its time lands within half a frame of the frame's).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg

from ditto_fast.captions.eia608 import Paced
from ditto_fast.core.errors import DittoError, UsageError
from ditto_fast.media.ffpipe import own_session
from ditto_fast.media.partfiles import create_locked

SEI_CODECS = {"h264", "hevc"}
ANC_CONTAINERS = {"mxf"}
C608_CODECS = {"prores"}
MAX_C608_RATE = 30              # the SCC reader's 33 ms frames: one line per frame up to 30 frames/s


def embeds_in_sei(container: str, codec: str) -> bool:
    """Whether captions go into the video's SEI (an H.264/HEVC stream outside MXF)."""
    return container not in ANC_CONTAINERS and codec in SEI_CODECS


def check_embeddable(container: str, codec: str, rate: Fraction, where: str) -> None:
    """UsageError naming `where` when 608 cannot be embedded in this container and codec at this rate."""
    if container in ANC_CONTAINERS or embeds_in_sei(container, codec):
        return
    if container == "mov" and codec in C608_CODECS:
        if rate > MAX_C608_RATE:
            raise UsageError(f"{where}: a c608 caption track is written here at up to {MAX_C608_RATE} frames/s, not "
                             f"{float(rate):g}; use --fps 29.97 or sidecars (--captions-out)")
        return
    raise UsageError(f"{where}: EIA-608 is not embedded in {container} {codec}; use MXF, H.264/HEVC, or ProRes .mov, "
                     "or ask for sidecars (--captions-out) or --burn-in")


def embed(path: Path, paced: Paced, rate: Fraction, container: str, codec: str, muxer_args: list[str]) -> None:
    """Rewrite the finished file `path` in place with `paced` embedded (see the module's table); `muxer_args`: the
    format's own muxer options (faststart, timecode, the container's name)."""
    out, lock = create_locked(path, "part", path.suffix)       # the captioned copy, beside it (flock'd)
    try:
        with tempfile.TemporaryDirectory(prefix="ditto-captions-") as work:
            work = Path(work)
            if embeds_in_sei(container, codec):
                es = work / f"video.{codec}"
                _run(["-i", str(path), "-map", "0:v:0", "-c", "copy", "-bsf:v",
                      f"{codec}_mp4toannexb,{codec}_metadata=aud=insert", "-f", codec, str(es)], path)
                es.write_bytes(insert_cc_sei(es.read_bytes(), paced.pairs, codec))
                tag = ["-tag:v", "hvc1"] if codec == "hevc" and container in ("mp4", "mov") else []
                _run(["-framerate", str(rate), "-f", codec, "-i", str(es), "-i", str(path), "-map", "0:v",
                      "-map", "1:a?", "-map_metadata", "1", "-c", "copy", *tag, *muxer_args, str(out)], path)
            else:
                feed = work / "feed.scc"
                feed.write_text(scc_feed(paced.pairs, rate))
                _run(["-i", str(path), "-i", str(feed), "-map", "0", "-map", "1", "-c", "copy", "-map_metadata", "0",
                      *muxer_args, str(out)], path)
        os.replace(out, path)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    finally:
        os.close(lock)


def scc_feed(pairs: list[tuple[int, int]], rate: Fraction) -> str:
    """An SCC text for ffmpeg's reader: one line per frame, its pair, at a timecode its reader turns into the
    frame's time within half a frame (ffmpeg reads HH:MM:SS:FF as seconds plus FF x 33 ms)."""
    lines = ["Scenarist_SCC V1.0", ""]
    for f, (a, b) in enumerate(pairs):
        ms = round(f * 1000 / rate)
        s, ff = divmod(ms, 1000)
        ff = round(ff / 33)
        lines += [f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}:{ff:02d}\t{a:02x}{b:02x}", ""]
    return "\n".join(lines)


def cc_data(pair: tuple[int, int]) -> bytes:
    """ATSC A/53 user data (GA94, cc_data) for one frame: the pair on field 1, a null pair on field 2."""
    triplets = bytes([0xFC, *pair, 0xFD, 0x80, 0x80])        # field 1: the pair; field 2: a null pair
    return bytes([0xB5, 0x00, 0x31]) + b"GA94" + bytes([0x03, 0x40 | 0x80 | 2, 0xFF]) + triplets + b"\xff"


def sei_nal(pair: tuple[int, int], codec: str) -> bytes:
    """An SEI NAL unit (with its start code) carrying `pair` as registered user data (payload type 4)."""
    payload = cc_data(pair)
    body = bytes([4, len(payload)]) + payload + b"\x80"       # payload type, size, payload, rbsp trailing bits
    header = b"\x06" if codec == "h264" else bytes([39 << 1, 0x01])     # H.264 SEI; HEVC prefix SEI
    return b"\x00\x00\x00\x01" + header + _emulation_prevented(body)


def _emulation_prevented(rbsp: bytes) -> bytes:
    """`rbsp` with 0x03 inserted after each pair of zero bytes followed by a byte of 3 or less."""
    out, zeros = bytearray(), 0
    for b in rbsp:
        if zeros >= 2 and b <= 3:
            out.append(3)
            zeros = 0
        out.append(b)
        zeros = zeros + 1 if b == 0 else 0
    return bytes(out)


_START = re.compile(b"\x00\x00\x01")


def _nal_units(es: bytes) -> list[tuple[int, int]]:
    """(start of the start code, start of the NAL header) of each NAL unit of an Annex B stream."""
    out = []
    for m in _START.finditer(es):
        begin = m.start() - 1 if m.start() > 0 and es[m.start() - 1] == 0 else m.start()
        out.append((begin, m.end()))
    return out


def insert_cc_sei(es: bytes, pairs: list[tuple[int, int]], codec: str) -> bytes:
    """An Annex B stream whose access units each begin with an access unit delimiter (one per frame, in display
    order: no B frames), each given an SEI with its frame's pair before its first picture NAL unit. ValueError when
    the stream's access units are not one per pair."""
    units = _nal_units(es)
    if codec == "h264":
        kind = lambda i: es[units[i][1]] & 0x1F                             # noqa: E731
        is_aud, is_vcl = (lambda t: t == 9), (lambda t: 1 <= t <= 5)
    else:
        kind = lambda i: (es[units[i][1]] >> 1) & 0x3F                      # noqa: E731
        is_aud, is_vcl = (lambda t: t == 35), (lambda t: t <= 31)
    out, pos, frame, inserted = bytearray(), 0, -1, True
    for i, (begin, _) in enumerate(units):
        t = kind(i)
        if is_aud(t):
            frame, inserted = frame + 1, False
        elif is_vcl(t) and not inserted and 0 <= frame < len(pairs):
            out += es[pos:begin] + sei_nal(pairs[frame], codec)
            pos, inserted = begin, True
    out += es[pos:]
    if frame + 1 != len(pairs):
        raise ValueError(f"the video has {frame + 1} access units, the captions {len(pairs)} frames")
    return bytes(out)


def _run(args: list[str], path: Path) -> None:
    """One ffmpeg remux step; DittoError naming the file and ffmpeg's complaint if it fails."""
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-y", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, errors="replace", start_new_session=own_session())
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise DittoError(f"embedding captions into {path} failed: {last[:200]}")
