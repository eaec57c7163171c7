"""WebRTC viewers of the live sessions, by WHEP (the IETF WebRTC-HTTP Egress Protocol): a viewer POSTs an SDP offer and
gets the answer; its peer connection (aiortc) sends the session's picture as the engine encoded it (H.264 access
units passed through: one encode however many watch) and its speech (as it came, 48 kHz) as Opus. A viewer ends by DELETE, by
leaving (its connection fails or closes), or with its session."""

from __future__ import annotations

import asyncio
import secrets
from fractions import Fraction
from typing import Any

import numpy as np

from ditto_fast.core.errors import UsageError
from ditto_fast.media.rates import STREAM_SAMPLE_RATE

QUEUED = 50                     # frames a viewer may fall behind before it waits for the next key frame
MAX_VIEWERS = 16                # viewers of one session


class _Feed:
    """What one viewer's two tracks take from a session, handed over from the engine's reader thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.video: asyncio.Queue = asyncio.Queue(QUEUED)
        self.audio: asyncio.Queue = asyncio.Queue(QUEUED)

    def take(self, media: tuple | None) -> None:
        """From the engine's reader thread: one frame's media (None: the session ended)."""
        self.loop.call_soon_threadsafe(self._put, media)

    def _put(self, media: tuple | None) -> None:
        for q, item in ((self.video, media and media[:3]), (self.audio, media and (media[0], media[3]))):
            if q.full():                        # a viewer that cannot keep up skips to the next key frame
                while not q.empty():
                    q.get_nowait()
                if q is self.video:
                    q.put_nowait(("skip",))
            q.put_nowait(item)


def _tracks(feed: _Feed, rate: Fraction):
    """The video and audio tracks of one viewer (aiortc's MediaStreamTrack), reading `feed`."""
    import av
    from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

    class Video(MediaStreamTrack):
        kind = "video"

        def __init__(self) -> None:
            super().__init__()
            self.keyed = False

        async def recv(self) -> av.Packet:
            while True:
                item = await feed.video.get()
                if item is None:
                    self.stop()
                    raise MediaStreamError
                if item[0] == "skip":
                    self.keyed = False
                    continue
                index, unit, key = item
                self.keyed = self.keyed or key
                if self.keyed:
                    packet = av.Packet(unit)
                    packet.pts, packet.time_base = index, 1 / rate
                    return packet

    class Audio(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.samples = 0

        async def recv(self) -> av.AudioFrame:
            item = await feed.audio.get()
            if item is None:
                self.stop()
                raise MediaStreamError
            pcm = np.frombuffer(item[1], "<i2").reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate, frame.pts = STREAM_SAMPLE_RATE, self.samples
            frame.time_base = Fraction(1, STREAM_SAMPLE_RATE)
            self.samples += pcm.shape[1]
            return frame

    return Video(), Audio()


class WhepViewers:
    """The WebRTC viewers of every session of one server."""

    def __init__(self) -> None:
        self._viewers: dict[str, dict[str, tuple[Any, Any]]] = {}      # session id -> viewer id -> (pc, leave)

    def count(self, sid: str) -> int:
        return len(self._viewers.get(sid, {}))

    async def offer(self, session: Any, sdp: str) -> tuple[str, str]:
        """A viewer of `session` for the SDP `sdp` (an offer to receive video and audio): (its id, the SDP answer).
        UsageError in one line for an offer it cannot answer."""
        from aiortc import RTCPeerConnection, RTCSessionDescription
        from aiortc.rtcrtpsender import RTCRtpSender

        if not session.active or session.link is None:
            raise UsageError(f"live session {session.id} has {session.state}; open a new one with POST /v1/live")
        if self.count(session.id) >= MAX_VIEWERS:
            raise UsageError(f"live session {session.id} has {MAX_VIEWERS} viewers already, the most it takes")
        if "v=0" not in sdp or "m=video" not in sdp:
            raise UsageError("send an SDP offer (Content-Type: application/sdp) that receives video (and audio)")
        h264 = [c for c in RTCRtpSender.getCapabilities("video").codecs
                if c.mimeType == "video/H264" and str(c.parameters.get("packetization-mode")) == "1"]
        if "H264/90000" not in sdp:
            raise UsageError("the offer has no H.264 video; this server sends H.264 (constrained baseline, "
                             "packetization-mode 1), as every WebRTC browser receives")
        loop = asyncio.get_running_loop()
        feed = _Feed(loop)
        video, audio = _tracks(feed, session.rate)
        pc = RTCPeerConnection()
        try:        # the senders first, so that the offer's m-lines take them (and H.264 alone for the picture)
            pc.addTransceiver(video, direction="sendonly").setCodecPreferences(h264)
            pc.addTransceiver(audio, direction="sendonly")
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as e:  # noqa: BLE001 - aiortc's refusals of an offer (its direction, its codecs)
            await pc.close()
            raise UsageError(f"the SDP offer cannot be answered: {type(e).__name__}: {e}") from None
        vid = secrets.token_hex(6)
        leave = session.link.watch(feed.take)
        self._viewers.setdefault(session.id, {})[vid] = (pc, leave)

        @pc.on("connectionstatechange")
        async def changed() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.end(session.id, vid)
        return vid, pc.localDescription.sdp

    async def end(self, sid: str, vid: str) -> bool:
        """End viewer `vid` of session `sid`; False if there is none."""
        pc, leave = self._viewers.get(sid, {}).pop(vid, (None, None))
        if pc is None:
            return False
        leave()
        await pc.close()
        return True

    async def close(self) -> None:
        """End every viewer (the server stops)."""
        for sid in list(self._viewers):
            for vid in list(self._viewers[sid]):
                await self.end(sid, vid)
