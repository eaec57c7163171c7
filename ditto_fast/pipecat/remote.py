"""The face of a Pipecat agent rendered by a running `ditto-fast serve` (`DittoFastVideoService(avatar, url=...)`): the
agent's process loads no network and imports no torch. At StartFrame the service opens a live session on the
server (POST /v1/live, no output of its own) and its WebSocket both ways: the TTS's audio goes up as it comes
(48 kHz: the server keeps its band), the session's frames come back (H.264, decoded here with PyAV) with their
speech, an interruption is passed on (`{"clear": true}`; the frames still on their way with the speech it cut are
muted: the server's `cleared` event says which), each TTS utterance's end too (`{"end": true}`); what
follows an utterance in the pipeline waits until the server says it has been played (playback_finished). EndFrame
lets the speech given be played, then ends the session; CancelFrame ends it at once."""

from __future__ import annotations

import asyncio
import json
import math
import struct
import time
import urllib.error
import urllib.request
from fractions import Fraction
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    StartFrame,
    SystemFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import ServiceSettings

from ditto_fast.audio.resample import Resampler
from ditto_fast.media.rates import STREAM_SAMPLE_RATE
from ditto_fast.pipecat.face import FaceService

FIELDS = ("emotion", "seed", "steps", "fps", "blend", "controls", "overlap", "max_latency")
END_WAIT_S = 60.0           # at an EndFrame, how long the speech given may take to be played
DRAIN_S = 0.6               # then how long the frames of the speech's end may still take to come (its encode, the net)
HTTP_TIMEOUT_S = 30.0
CLEARED_WAIT_S = 2.0        # after a clear, how long frames stay muted if the server never says which (an older one)


class RemoteVideoService(FaceService):
    """A talking face from a running serve at `url` (http://HOST:PORT), `token` its bearer token; the live
    settings as the in-process service takes them (checked by the server: a refusal is one ErrorFrame and the audio
    passes on, so the agent still speaks)."""

    def __init__(self, avatar: str, *, url: str, token: str | None = None, **settings: Any) -> None:
        unknown = sorted(set(settings) - set(FIELDS))
        if unknown:
            raise TypeError(f"unknown setting {unknown[0]!r}; a live session takes {', '.join(FIELDS)}")
        kwargs = {k: settings.pop(k) for k in list(settings) if k not in FIELDS}
        super().__init__(settings=ServiceSettings(model=None), **kwargs)
        self._url, self._token = url.rstrip("/"), token
        self._body = {"avatar": avatar, **{k: v for k, v in settings.items() if v is not None}}
        self._sid: str | None = None
        self._ws: Any = None
        self._reader: asyncio.Task | None = None
        self._resampler: Resampler | None = None
        self._decoder: Any = None
        self._size: tuple[int, int] | None = None
        self._rate = Fraction(25)
        self._segment = 0               # the server's number of the utterance being sent (or last sent)
        self._open = False              # an utterance is being sent
        self._finished = 0              # the last utterance played (or interrupted)
        self._held: list[tuple[int, Frame]] = []            # (the utterance it follows, the frame)
        self._played: list[tuple[int, int]] = []            # (frame that carried its end, utterance), not yet shown
        self._shown = -1                                    # the index of the last frame pushed
        self._muted_through: float = -1                     # frames up to here carry speech an interruption cut
        self._muted_since = 0.0                             # when that clear was sent
        self._ended = asyncio.Event()

    @property
    def size(self) -> tuple[int, int] | None:
        """The frames' (width, height), once they come."""
        return self._size

    @property
    def rate(self) -> Fraction:
        return self._rate

    @property
    def session(self) -> str | None:
        """The server's id of the live session."""
        return self._sid

    # -- life ------------------------------------------------------------------------------------------------------
    async def _open_session(self) -> None:
        import websockets

        try:
            view = await asyncio.to_thread(self._call, "POST", "/v1/live", self._body)
        except OSError as e:        # no server there: the agent speaks on without its face
            await self.push_error(f"the avatar's server at {self._url} cannot be reached: {e}")
            return
        if view.get("id") is None:
            await self.push_error(f"the avatar's live session was refused: {view.get('error') or view}")
            return
        self._sid = view["id"]
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        ws_url = "ws" + self._url[4:] + view["audio"]
        self._ws = await websockets.connect(ws_url, additional_headers=headers, max_size=None)
        await self._ws.send(json.dumps({"rate": STREAM_SAMPLE_RATE, "media": True}))
        self._reader = self.create_task(self._read(), name="ditto-fast-remote-read")

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        req = urllib.request.Request(self._url + path, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return json.loads(e.read() or b"{}") or {"error": f"HTTP {e.code}"}

    async def _end(self, graceful: bool) -> None:
        if self._ws is None:
            return
        ws, self._ws = self._ws, None
        try:
            if graceful:
                await self._end_utterance(ws)
                deadline = time.monotonic() + END_WAIT_S
                while self._finished < self._segment and time.monotonic() < deadline and not self._ended.is_set():
                    await asyncio.sleep(0.02)
                await asyncio.sleep(DRAIN_S)            # the frames of the speech's end, still on their way
            await ws.close()
        finally:
            if self._reader is not None:
                await self.cancel_task(self._reader)
                self._reader = None
            if self._sid is not None:
                await asyncio.to_thread(self._call, "DELETE", f"/v1/live/{self._sid}")
            for _, f in self._held:
                await self.push_frame(f)
            self._held = []

    # -- speech up -------------------------------------------------------------------------------------------------
    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            await self._open_session()
            return
        ws = self._ws
        if isinstance(frame, TTSAudioRawFrame) and direction == FrameDirection.DOWNSTREAM and ws is not None:
            await self._send_audio(ws, frame)
            return
        if isinstance(frame, (InterruptionFrame, UserStartedSpeakingFrame)) and ws is not None:
            await self._interrupt(ws)
        elif isinstance(frame, TTSStoppedFrame) and ws is not None:
            await self._end_utterance(ws)
        if direction == FrameDirection.DOWNSTREAM and not isinstance(frame, (SystemFrame, EndFrame)) \
                and ws is not None and self._finished < self._segment:
            self._held.append((self._segment, frame))       # after the speech before it was played
            return
        await self.push_frame(frame, direction)

    async def _send_audio(self, ws: Any, frame: TTSAudioRawFrame) -> None:
        r = self._resampler
        if r is None or (r.rate, r.channels) != (frame.sample_rate, frame.num_channels):
            r = self._resampler = Resampler(frame.sample_rate, frame.num_channels, to=STREAM_SAMPLE_RATE)
        samples = r(frame.audio)
        if len(samples):
            if not self._open:
                self._open, self._segment = True, self._segment + 1
            await ws.send(_s16(samples))

    async def _end_utterance(self, ws: Any) -> None:
        if self._resampler is not None:
            tail = self._resampler.flush()
            if len(tail) and self._open:
                await ws.send(_s16(tail))
        if self._open:
            self._open = False
            await ws.send(json.dumps({"end": True}))

    async def _interrupt(self, ws: Any) -> None:
        """The caller speaks: the server drops what was not played; what waits for it here goes (but the frames
        that are not interruptible)."""
        if self._resampler is not None:
            self._resampler.flush()
        self._open = False
        self._muted_through, self._muted_since = math.inf, time.monotonic()      # until the server says which
        await ws.send(json.dumps({"clear": True}))
        self._finished = self._segment
        kept = [f for _, f in self._held if not f.interruptible]
        self._held = []
        for f in kept:
            await self.push_frame(f)

    # -- frames down -----------------------------------------------------------------------------------------------
    async def _read(self) -> None:
        """What the session sends: its frames (decoded here, off the event loop) and its playback events."""
        try:
            async for message in self._ws:
                if isinstance(message, bytes):
                    await self._show(message)
                    continue
                said = json.loads(message)
                if said.get("event") == "playback_finished":
                    self._played.append((said["frame"], said["segment"]))
                    await self._release()
                elif said.get("event") == "cleared":
                    self._muted_through = said["frame"]
                elif "error" in said:
                    await self.push_error(f"the avatar's live session: {said['error']}")
        except Exception as e:  # noqa: BLE001 - the connection lost: said once, the agent speaks on
            if self._ws is not None:
                logger.warning(f"{self}: the avatar's session connection ended: {e}")
        finally:
            self._ended.set()

    async def _release(self) -> None:
        """The frames held for speech now shown: a segment counts as played once the frame that carried its end has
        been pushed."""
        while self._played and self._played[0][0] <= self._shown:
            self._finished = max(self._finished, self._played.pop(0)[1])
        ready = [f for s, f in self._held if s <= self._finished]
        self._held = [(s, f) for s, f in self._held if s > self._finished]
        for f in ready:
            await self.push_frame(f)

    async def _show(self, message: bytes) -> None:
        size = struct.unpack(">I", message[:4])[0]
        header = json.loads(message[4:4 + size])
        unit = message[4 + size:4 + size + header["unit"]]
        pcm = message[4 + size + header["unit"]:]
        self._rate = Fraction(header["rate"])
        images = await asyncio.to_thread(self._decode, unit)
        for image, size in images:
            self._size = size
            await self.push_frame(OutputImageRawFrame(image=image, size=size, format="RGB"))
        index = header["index"]
        if self._muted_through == math.inf and time.monotonic() - self._muted_since > CLEARED_WAIT_S:
            self._muted_through = index - 1                 # a server that does not say: muted long enough
        if index <= self._muted_through:                    # on its way when the caller interrupted: not heard
            pcm = bytes(len(pcm))
        audio = TTSAudioRawFrame if any(pcm) else OutputAudioRawFrame
        await self.push_frame(audio(audio=pcm, sample_rate=header["pcm_rate"], num_channels=1))
        self._shown = index
        if self._played:
            await self._release()

    def _decode(self, unit: bytes) -> list[tuple[bytes, tuple[int, int]]]:
        import av

        if self._decoder is None:
            self._decoder = av.CodecContext.create("h264", "r")
        return [(f.to_ndarray(format="rgb24").tobytes(), (f.width, f.height))
                for f in self._decoder.decode(av.Packet(unit))]


def _s16(samples) -> bytes:
    import numpy as np

    return np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()
