"""`RemoteFace`: the face of a Pipecat agent rendered by a running `ditto-fast serve` (`DittoFastVideoService(avatar,
url=...)`): the
agent's process loads no network and imports no torch. At StartFrame the service opens a live session on the
server (POST /v1/live, no output of its own) and its WebSocket both ways: the TTS's audio goes up as it comes
(48 kHz: the server keeps its band), the session's frames come back (H.264, decoded here with PyAV) with their
speech, an interruption is passed on (`{"clear": true}`; the frames still on their way with the speech it cut are
muted: the server's `cleared` event says which), each TTS utterance's end too (`{"end": true}`); what
follows an utterance in the pipeline waits until the server says it has been played (playback_finished) and the
frame that carried its end has gone out here. EndFrame lets the speech given be played, then ends the session;
CancelFrame ends it at once.

Without its server (unreachable, gone mid-answer, or refusing the session) the agent speaks on without its face:
one ErrorFrame says so, the TTS's audio and the frames after it pass on as they came, and a new session is tried
every RETRY_S while no answer is spoken and at each answer's start; once one opens, the face is back. A URL where
no ditto-fast serve answers is one ErrorFrame that says so (and is not tried again)."""

from __future__ import annotations

import asyncio
import json
import struct
import time
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
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.utils.errors import ErrorCategory, classify_http_status_code

from ditto_fast.audio.resample import Resampler
from ditto_fast.core.errors import UsageError
from ditto_fast.live.held import Held, Mute
from ditto_fast.media.rates import STREAM_SAMPLE_RATE
from ditto_fast.pipecat.face import Face
from ditto_fast.pipecat.remote_api import NotAServe, Refused, end_session, open_session

FIELDS = ("emotion", "seed", "steps", "fps", "blend", "controls", "overlap", "max_latency")
END_WAIT_S = 60.0           # at an EndFrame, how long the speech given may take to be played
DRAIN_S = 0.6               # then how long the frames of the speech's end may still take to come (its encode, the net)
HTTP_TIMEOUT_S = 30.0       # the first session's opening
REOPEN_TIMEOUT_S = 5.0      # a new one's, once the server was lost (an answer's start waits for it)
RETRY_S = 2.0               # without a session, how often a new one is tried while no answer is spoken
CLEARED_WAIT_S = 2.0        # after a clear, how long frames stay muted if the server never says which (an older one)


class RemoteFace(Face):
    """A talking face from a running serve at `url` (http://HOST:PORT), `token` its bearer token, pushed through the
    Pipecat service `out`; the live settings as the in-process face takes them (checked by the server: a refusal is
    one ErrorFrame and the audio passes on, so the agent still speaks)."""

    def __init__(self, out: Any, avatar: str, *, url: str, token: str | None = None, **settings: Any) -> None:
        unknown = sorted(set(settings) - set(FIELDS))
        if unknown:
            raise TypeError(f"unknown setting {unknown[0]!r}; a live session takes {', '.join(FIELDS)}")
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"url= takes the address of a running `ditto-fast serve`, http://HOST:PORT (got {url!r})")
        super().__init__(out)
        self._url, self._token = url.rstrip("/"), token
        self._body = {"avatar": avatar, **{k: v for k, v in settings.items() if v is not None}}
        self._sid: str | None = None
        self._stale: str | None = None  # a session whose connection was lost (ended at the next opening)
        self._ws: Any = None
        self._reader: asyncio.Task | None = None
        self._retry: asyncio.Task | None = None
        self._opening = asyncio.Lock()
        self._said = False              # the face's absence was told (once, until a session opens again)
        self._speaking = False          # a TTS answer is under way
        self._stopping = False
        self._resampler: Resampler | None = None
        self._decoder: Any = None
        self._last: tuple[bytes, tuple[int, int]] | None = None     # the last picture pushed, and its size
        self._segment = 0               # the server's number of the utterance being sent (or last sent)
        self._open = False              # an utterance is being sent
        self._finished = 0              # the last utterance played (or interrupted)
        self._held = Held()                                 # marked by the utterance each follows
        self._played: list[tuple[int, int]] = []            # (frame that carried its end, utterance), not yet shown
        self._shown = -1                                    # the index of the last frame pushed
        self._mute = Mute()                                 # by frame index: those carry speech an interruption cut
        self._ended = asyncio.Event()
        self._gone = False              # no serve answers at the URL: not tried again
        self._closed = False            # ended here

    @property
    def state(self) -> str:
        """The face's state, in live/states.py's words: starting until a session opens (and again while a new one
        is tried, its server gone), streaming, ending, ended; failed where no serve answers at the URL."""
        if self._closed:
            return "ended"
        if self._stopping:
            return "ending"
        if self._gone:
            return "failed"
        return "streaming" if self._ws is not None else "starting"

    @property
    def session(self) -> str | None:
        """The server's id of the live session (None while there is none)."""
        return self._sid

    # -- life ------------------------------------------------------------------------------------------------------
    async def _connect(self, timeout: float) -> bool:
        """Open a live session and its WebSocket unless one is open; False (said once) where none could be."""
        import websockets

        async with self._opening:
            if self._ws is not None:
                return True
            if self._stopping or not self.out.is_usable:
                return False
            stale, self._stale = self._stale, None
            try:
                view = await asyncio.to_thread(self._open_session, stale, timeout)
            except NotAServe as e:
                self._gone = True
                await self._tell(f"{self._url} is not a ditto-fast serve ({e}): give url= the address `ditto-fast "
                                 "serve` listens on (http://HOST:8750); the agent speaks on without its face",
                                 ErrorCategory.INVALID_REQUEST)
                return False
            except Refused as e:
                await self._tell(f"the avatar's live session was refused by {self._url}: {e}",
                                 classify_http_status_code(e.status))
                return False
            except OSError as e:
                await self._tell(self._without(f"cannot be reached ({_reason(e)})"), ErrorCategory.CONNECTIVITY)
                return False
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            try:
                ws = await asyncio.wait_for(websockets.connect("ws" + self._url[4:] + view["audio"], max_size=None,
                                                               additional_headers=headers), timeout)
                await ws.send(json.dumps({"rate": STREAM_SAMPLE_RATE, "media": True}))
            except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as e:
                await asyncio.to_thread(end_session, self._url, self._token, view["id"], timeout)
                await self._tell(self._without(f"took the session but not its WebSocket ({_reason(e)})"),
                                 ErrorCategory.CONNECTIVITY)
                return False
            if self._said:
                logger.info(f"{self.out}: the avatar's server at {self._url} answers again: live session {view['id']}")
            self._said, self._gone, self._sid, self._ws = False, False, view["id"], ws
            self._decoder, self._resampler, self._open, self._segment, self._finished = None, None, False, 0, 0
            self._played, self._shown, self._mute = [], -1, Mute()
            self._ended = asyncio.Event()
            self._reader = self.out.create_task(self._read(ws), name="ditto-fast-remote-read")
            return True

    def _open_session(self, stale: str | None, timeout: float) -> dict:
        if stale is not None:           # its connection was lost, the server may live on
            end_session(self._url, self._token, stale, timeout)
        return open_session(self._url, self._token, self._body, timeout)

    def _without(self, what: str) -> str:
        return (f"the avatar's server at {self._url} {what}: the agent speaks on without its face, and gets it back "
                "from a new session once the server answers")

    async def _tell(self, line: str, category: ErrorCategory) -> None:
        """One ErrorFrame while the face is away (the next ones go to the debug log); retries while it may come back."""
        if not self._said:
            self._said = True
            await self.out.push_error(line, category=category)
        else:
            logger.debug(f"{self.out}: {line}")
        self._keep_trying()

    def _keep_trying(self) -> None:
        if (self._retry is None or self._retry.done()) and not self._stopping and self.out.is_usable:
            self._retry = self.out.create_task(self._retry_loop(), name="ditto-fast-remote-retry")

    async def _retry_loop(self) -> None:
        while self._ws is None and not self._stopping and self.out.is_usable:
            await asyncio.sleep(RETRY_S)
            if not self._speaking:      # an answer under way goes on as it started
                await self._connect(REOPEN_TIMEOUT_S)

    async def _lose(self, ws: Any, why: str) -> None:
        """The session's connection `ws` is gone: said once; what waits for its speech goes on, the audio after it
        passes as it came."""
        if ws is None or self._ws is not ws:
            return                      # told already, or ended here
        self._ws, self._stale, self._sid = None, self._sid, None
        self._open, self._finished, self._played = False, self._segment, []
        reader, self._reader = self._reader, None
        held = self._held.drain()
        await self._tell(self._without(f"went away ({why})"), ErrorCategory.CONNECTIVITY)
        for f in held:
            await self.out.push_frame(f)
        if reader is not None and reader is not asyncio.current_task():
            await self.out.cancel_task(reader)

    async def end(self, graceful: bool) -> None:
        """End the session; graceful: once the speech given has been played."""
        self._stopping = True
        if self._retry is not None:
            await self.out.cancel_task(self._retry)
            self._retry = None
        if self._ws is None:
            if self._stale is not None:
                await asyncio.to_thread(end_session, self._url, self._token, self._stale, REOPEN_TIMEOUT_S)
                self._stale = None
            self._closed = True
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
                await self.out.cancel_task(self._reader)
                self._reader = None
            if self._sid is not None:
                await asyncio.to_thread(end_session, self._url, self._token, self._sid, HTTP_TIMEOUT_S)
            self._closed = True
            for f in self._held.drain():
                await self.out.push_frame(f)

    # -- speech up -------------------------------------------------------------------------------------------------
    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """TTS audio up to the session; interruptions and answers' ends passed on; what follows speech held."""
        if isinstance(frame, StartFrame):
            await self.out.push_frame(frame, direction)
            await self._connect(HTTP_TIMEOUT_S)
            return
        down = direction == FrameDirection.DOWNSTREAM
        if down and isinstance(frame, (TTSStartedFrame, TTSAudioRawFrame)) and not self._speaking:
            self._speaking = True       # an answer starts: with its face if the server is back
            if self._ws is None:
                await self._connect(REOPEN_TIMEOUT_S)
        ws = self._ws
        if isinstance(frame, TTSAudioRawFrame) and down and ws is not None and await self._send_audio(ws, frame):
            return
        if isinstance(frame, (InterruptionFrame, UserStartedSpeakingFrame)):
            self._speaking = False
            if ws is not None:
                await self._interrupt(ws)
        elif isinstance(frame, TTSStoppedFrame):
            self._speaking = False
            if ws is not None:
                await self._end_utterance(ws)
        if down and not isinstance(frame, (SystemFrame, EndFrame)) and self._ws is not None \
                and self._finished < self._segment:
            self._held.hold(self._segment, frame)           # after the speech before it was played
            return
        await self.out.push_frame(frame, direction)

    async def _send(self, ws: Any, message: bytes | str) -> bool:
        """Send on the session's WebSocket; False where the connection is gone (lost: said once)."""
        import websockets

        try:
            await ws.send(message)
            return True
        except (OSError, websockets.ConnectionClosed) as e:
            await self._lose(ws, _reason(e))
            return False

    async def _send_audio(self, ws: Any, frame: TTSAudioRawFrame) -> bool:
        """The TTS's audio up to the session (False: the session is gone, the frame goes on as it came)."""
        r = self._resampler
        if r is None or (r.rate, r.channels) != (frame.sample_rate, frame.num_channels):
            r = self._resampler = Resampler(frame.sample_rate, frame.num_channels, to=STREAM_SAMPLE_RATE)
        samples = r(frame.audio)
        if not len(samples):
            return True
        if not self._open:
            self._open, self._segment = True, self._segment + 1
        return await self._send(ws, _s16(samples))

    async def _end_utterance(self, ws: Any) -> None:
        if self._resampler is not None:
            tail = self._resampler.flush()
            if len(tail) and self._open and not await self._send(ws, _s16(tail)):
                return
        if self._open:
            self._open = False
            await self._send(ws, json.dumps({"end": True}))

    async def _interrupt(self, ws: Any) -> None:
        """The caller speaks: the server drops what was not played; what waits for it here goes (but the frames
        that are not interruptible)."""
        if self._resampler is not None:
            self._resampler.flush()
        self._open = False
        self._mute.unknown(time.monotonic(), CLEARED_WAIT_S)                # until the server says which
        if not await self._send(ws, json.dumps({"clear": True})):
            return
        self._finished = self._segment
        for f in self._held.interrupt():
            await self.out.push_frame(f)

    # -- frames down -----------------------------------------------------------------------------------------------
    async def _read(self, ws: Any) -> None:
        """What the session sends: its frames (decoded here, off the event loop) and its playback events; then, its
        connection gone (the server stopped, the network), the loss."""
        why = "it closed the session's connection"
        try:
            async for message in ws:
                if isinstance(message, bytes):
                    await self._show(message)
                    continue
                said = json.loads(message)
                if said.get("event") == "playback_finished":
                    self._played.append((said["frame"], said["segment"]))
                    await self._release()
                elif said.get("event") == "cleared":
                    self._mute.said(said["frame"] + 1)     # up to that frame: the speech cut
                elif "error" in said:
                    why = f"the live session: {said['error']}"
        except Exception as e:  # noqa: BLE001 - the connection lost: said once, the agent speaks on
            why = _reason(e)
        self._ended.set()
        await self._lose(ws, why)

    async def _release(self) -> None:
        """The frames held for speech now shown: a segment counts as played once the frame that carried its end has
        been pushed."""
        while self._played and self._played[0][0] <= self._shown:
            self._finished = max(self._finished, self._played.pop(0)[1])
        for f in self._held.through(self._finished):
            await self.out.push_frame(f)

    async def _show(self, message: bytes) -> None:
        size = struct.unpack(">I", message[:4])[0]
        header = json.loads(message[4:4 + size])
        unit = message[4 + size:4 + size + header["unit"]]
        pcm = message[4 + size + header["unit"]:]
        self._rate = Fraction(header["rate"])
        if unit:
            images = await asyncio.to_thread(self._decode, unit)
        else:                               # its picture skipped (this end fell behind): the last one stays
            images = [self._last] if self._last is not None else []
        for image, size in images:
            self._size, self._last = size, (image, size)
            await self.out.push_frame(OutputImageRawFrame(image=image, size=size, format="RGB"))
        index = header["index"]
        if self._mute.muted(index, time.monotonic()):      # on its way when the caller interrupted: not heard
            pcm = bytes(len(pcm))
        audio = TTSAudioRawFrame if any(pcm) else OutputAudioRawFrame
        await self.out.push_frame(audio(audio=pcm, sample_rate=header["pcm_rate"], num_channels=1))
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


def _reason(e: BaseException) -> str:
    """An exception as a few words for a line: what a lost or refused connection says."""
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:200]
