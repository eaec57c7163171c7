"""WebRTC viewers of the live sessions, by WHEP (the IETF WebRTC-HTTP Egress Protocol): a viewer POSTs an SDP offer and
gets the answer; its peer connection (aiortc) sends the session's picture as the engine encoded it (H.264 access
units passed through: one encode however many watch) and its speech (as it came, 48 kHz) as Opus, in 20 ms frames
each with its own RTP timestamp, in step with the picture. A viewer ends by DELETE, by leaving (its connection fails
or closes), by not connecting within CONNECT_S, or with its session."""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from fractions import Fraction
from typing import Any

import numpy as np

from ditto_fast.core.errors import UsageError
from ditto_fast.media.rates import STREAM_SAMPLE_RATE
from ditto_fast.serve.live.sdp import offer_media

QUEUED = 50                     # frames a viewer may fall behind before it waits for the next key frame
MAX_VIEWERS = 16                # viewers of one session
CONNECT_S = 15.0                # a viewer whose connection is not made by then is dropped (its slot freed)
RETRY_AFTER_S = 30              # what a viewer refused for a full session is told to wait
OPUS_SAMPLES = STREAM_SAMPLE_RATE // 50     # 960: the 20 ms frame aiortc's Opus encoder makes one packet of


class ViewersFull(UsageError):
    """A session has MAX_VIEWERS viewers (or offers being answered) already: try again later (503)."""

    retry_after = RETRY_AFTER_S


class AudioSlices:
    """A session's audio as it comes with its frames (each frame index and the PCM of its slot) cut in OPUS_SAMPLES
    pieces with consecutive pts (48 kHz samples; a frame's first sample at index / rate, as its picture): one Opus
    packet, one RTP timestamp each. A slot's remainder waits for the next frame's; frames missed (a viewer that fell
    behind) leave a gap of their slots, so the sound stays in step with the picture."""

    def __init__(self, rate: Fraction, size: int = OPUS_SAMPLES) -> None:
        self.rate, self.size = Fraction(rate), size
        self._held = np.zeros(0, np.int16)
        self._pts = 0                   # the first held sample's
        self._next: int | None = None   # the frame index expected next

    def add(self, index: int, pcm: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Frame `index`'s PCM (int16, mono): the whole pieces now ready, (pts, int16[size]) each, in order."""
        if self._next is None or index != self._next:   # the first frame, or frames missed: a remainder is dropped
            self._held = np.zeros(0, np.int16)
            self._pts = index * STREAM_SAMPLE_RATE * self.rate.denominator // self.rate.numerator
        self._next = index + 1
        held = np.concatenate([self._held, np.asarray(pcm, np.int16).reshape(-1)])
        whole = len(held) // self.size * self.size
        out = [(self._pts + i, held[i:i + self.size]) for i in range(0, whole, self.size)]
        self._held, self._pts = held[whole:], self._pts + whole
        return out


class _Feed:
    """What one viewer's two tracks take from a session, handed over from the engine's reader thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, audio: bool = True):
        self.loop = loop
        self.video: asyncio.Queue = asyncio.Queue(QUEUED)
        self.audio: asyncio.Queue | None = asyncio.Queue(QUEUED) if audio else None

    def take(self, media: tuple | None) -> None:
        """From the engine's reader thread: one frame's media (None: the session ended)."""
        self.loop.call_soon_threadsafe(self._put, media)

    def _put(self, media: tuple | None) -> None:
        for q, item in ((self.video, media and media[:3]), (self.audio, media and (media[0], media[3]))):
            if q is None:
                continue
            if q.full():                        # a viewer that cannot keep up skips to the next key frame
                while not q.empty():
                    q.get_nowait()
                if q is self.video:
                    q.put_nowait(("skip",))
            q.put_nowait(item)


def _tracks(feed: _Feed, rate: Fraction):
    """The video and audio tracks of one viewer (aiortc's MediaStreamTrack), reading `feed` (the audio one None
    for a feed without audio)."""
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
            self.slices = AudioSlices(rate)
            self.ready: deque = deque()

        async def recv(self) -> av.AudioFrame:
            while not self.ready:
                item = await feed.audio.get()
                if item is None:
                    self.stop()
                    raise MediaStreamError
                self.ready.extend(self.slices.add(item[0], np.frombuffer(item[1], "<i2")))
            pts, pcm = self.ready.popleft()     # stereo, as the encoder takes it: its mono upmix is 3 dB down
            frame = av.AudioFrame.from_ndarray(np.repeat(pcm, 2).reshape(1, -1), format="s16", layout="stereo")
            frame.sample_rate, frame.pts = STREAM_SAMPLE_RATE, pts
            frame.time_base = Fraction(1, STREAM_SAMPLE_RATE)
            return frame

    return Video(), Audio() if feed.audio is not None else None


class WhepViewers:
    """The WebRTC viewers of every session of one server. A viewer's slot is taken before its offer is answered
    (MAX_VIEWERS a session however many offers come at once) and given back if its connection is not made within
    `connect_s`."""

    def __init__(self, connect_s: float = CONNECT_S) -> None:
        self.connect_s = connect_s
        self._viewers: dict[str, dict[str, tuple[Any, Any]]] = {}      # session id -> viewer id -> (pc, leave)
        self._waits: set[asyncio.Task] = set()                          # the deadlines of viewers not yet connected

    def count(self, sid: str) -> int:
        """Viewers of session `sid`, those whose offer is being answered or whose connection is being made too."""
        return len(self._viewers.get(sid, {}))

    async def offer(self, session: Any, sdp: str) -> tuple[str, str]:
        """A viewer of `session` for the SDP `sdp` (an offer to receive video, and audio unless it has none): (its
        id, the SDP answer). UsageError in one line for an offer it cannot answer; ViewersFull past MAX_VIEWERS."""
        if not session.active or session.link is None:
            raise UsageError(f"live session {session.id} has {session.state}; open a new one with POST /v1/live")
        kinds = offer_media(sdp)
        viewers = self._viewers.setdefault(session.id, {})
        if len(viewers) >= MAX_VIEWERS:
            raise ViewersFull(f"live session {session.id} has {MAX_VIEWERS} viewers already, the most it takes; "
                              f"try again later (Retry-After: {RETRY_AFTER_S} s)")
        vid = secrets.token_hex(6)
        viewers[vid] = (None, None)                     # the slot is taken before any await
        try:
            pc, feed, answer = await self._answer(session, sdp, "audio" in kinds)
        except BaseException:
            viewers.pop(vid, None)
            raise
        if viewers.get(vid) != (None, None):            # the session (or the server) ended meanwhile
            await pc.close()
            raise UsageError(f"live session {session.id} has {session.state}; open a new one with POST /v1/live")
        viewers[vid] = (pc, session.link.watch(feed.take))

        @pc.on("connectionstatechange")
        async def changed() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.end(session.id, vid)
        wait = asyncio.ensure_future(self._deadline(session.id, vid, pc))
        self._waits.add(wait)
        wait.add_done_callback(self._waits.discard)
        return vid, answer

    async def _answer(self, session: Any, sdp: str, audio: bool) -> tuple[Any, _Feed, str]:
        """A peer connection sending `session` (and its audio if `audio`) for the offer `sdp`, the feed its tracks
        read and its SDP answer."""
        from aiortc import RTCPeerConnection, RTCSessionDescription
        from aiortc.rtcrtpsender import RTCRtpSender

        h264 = [c for c in RTCRtpSender.getCapabilities("video").codecs
                if c.mimeType == "video/H264" and str(c.parameters.get("packetization-mode")) == "1"]
        feed = _Feed(asyncio.get_running_loop(), audio)
        video, sound = _tracks(feed, session.rate)
        pc = RTCPeerConnection()
        try:        # the senders first, so that the offer's m-lines take them (and H.264 alone for the picture)
            pc.addTransceiver(video, direction="sendonly").setCodecPreferences(h264)
            if sound is not None:
                pc.addTransceiver(sound, direction="sendonly")
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as e:  # noqa: BLE001 - aiortc's refusals of an offer (its direction, its codecs)
            await pc.close()
            said = str(e) or "aiortc could not read it"
            raise UsageError(f"the SDP offer cannot be answered ({type(e).__name__}: {said}); send an offer to "
                             "receive (recvonly) H.264 video and Opus audio, as createOffer makes it") from None
        return pc, feed, pc.localDescription.sdp

    async def _deadline(self, sid: str, vid: str, pc: Any) -> None:
        """Drop viewer `vid` if its connection is not made within `connect_s` (an offer whose ICE never completes)."""
        await asyncio.sleep(self.connect_s)
        if pc.connectionState != "connected" and self._viewers.get(sid, {}).get(vid, (None,))[0] is pc:
            await self.end(sid, vid)

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
        for wait in list(self._waits):
            wait.cancel()
