"""A WHEP viewer's SDP offer read before aiortc takes it: what it asks to receive, or the one line that is wrong with
it (aiortc's own parser stops at a bad line with a bare AssertionError or KeyError)."""

from __future__ import annotations

import re

from ditto_fast.core.errors import UsageError

_LINE = re.compile(r"^[a-z]=")
_MEDIA = re.compile(r"^m=(\w+) \d+ [A-Z/]+ (.+)$")
_CONNECTION = re.compile(r"^c=IN IP[46] \S+$")
_NEEDED = {"a=ice-ufrag:": "ICE credentials (a=ice-ufrag, a=ice-pwd)", "a=ice-pwd:": "ICE credentials (a=ice-ufrag, "
           "a=ice-pwd)", "a=fingerprint:": "a DTLS fingerprint (a=fingerprint)", "a=setup:": "a DTLS role (a=setup)"}
FIX = "send the offer your WebRTC stack made (createOffer), whole, as the body with Content-Type: application/sdp"


def _payload_type(text: str) -> bool:
    """Whether `text` is an RTP payload type an offer may use (RTCP's 72-76 may not be)."""
    return text.isdigit() and int(text) < 128 and not 72 <= int(text) <= 76


def offer_media(sdp: str) -> set[str]:
    """The kinds of media (`video`, `audio`) the SDP offer `sdp` has m-lines for; UsageError in one line naming what
    is wrong with it: not an SDP, a malformed line, no video, no H.264, no ICE credentials or DTLS fingerprint."""
    lines = [line for line in sdp.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0].strip() != "v=0":
        raise UsageError(f"the body is not an SDP offer (it must begin with v=0); {FIX}")
    kinds: list[str] = []
    h264 = False
    for n, line in enumerate(lines, 1):
        bad = None
        if not _LINE.match(line):
            bad = "not a type=value line"
        elif line.startswith("m="):
            m = _MEDIA.match(line)
            if m is None or (m.group(1) in ("audio", "video") and not all(_payload_type(f)
                                                                          for f in m.group(2).split())):
                bad = "not a media line (m=KIND PORT PROTOCOL PAYLOAD-TYPES, each a number 0-127 but 72-76)"
            else:
                kinds.append(m.group(1))
        elif line.startswith("c=") and not _CONNECTION.match(line):
            bad = "not a connection line (c=IN IP4 ADDRESS or c=IN IP6 ADDRESS)"
        elif line.startswith("a=candidate:") and len(line.split()) < 8:
            bad = "an ICE candidate with fewer than its 8 fields"
        elif line.startswith("a=setup:") and line[8:].strip() not in ("active", "passive", "actpass", "holdconn"):
            bad = "a DTLS setup role other than active, passive or actpass"
        elif line.startswith("a=rtpmap:") and kinds and kinds[-1] == "video" and "H264/90000" in line:
            h264 = True
        if bad:
            shown = line if len(line) <= 80 else line[:77] + "..."
            raise UsageError(f"the SDP offer's line {n} ({shown!r}) is {bad}; {FIX}")
    if "video" not in kinds:
        raise UsageError("the SDP offer has no video (m=video): offer to receive video, and audio to hear the "
                         "speech (addTransceiver('video', {direction: 'recvonly'}), the same for 'audio')")
    if not h264:
        raise UsageError("the offer has no H.264 video; this server sends H.264 (constrained baseline, "
                         "packetization-mode 1), as every WebRTC browser receives")
    sections = "\n".join(lines).split("\nm=")
    for kind, section in zip(kinds, sections[1:]):        # each media section, or the session above them, has them
        for needed, what in _NEEDED.items():
            if needed not in sections[0] and f"\n{needed}" not in section:
                raise UsageError(f"the SDP offer's m={kind} section lacks {what}, without which no connection "
                                 f"is made (was it cut short?); {FIX}")
    return set(kinds) & {"video", "audio"}
