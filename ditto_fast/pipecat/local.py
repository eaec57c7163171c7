"""`LocalFace`: the face `DittoFastVideoService` gives the agent's speech when it is rendered on this machine. The
TTS's audio feeds the same live session as `ditto-fast live` (live/session.py: the online motion loop, the frame
clock); each frame it sends comes back into the pipeline as an `OutputImageRawFrame` with its slot's
audio, in step, at the avatar's rate.

Threads: the session's own (motion, frames, output) and one that runs it; the output thread hands each frame to the
event loop, where one task pushes them in order. Frames that follow the speech in the pipeline (the TTS's
`TTSStoppedFrame`, its text) are held until the speech before them has been shown, so that an output transport sees
them in step with the audio it plays.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
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

from ditto_fast.audio.resample import BandResampler
from ditto_fast.engine.options import EngineOptions
from ditto_fast.live.frame_output import FrameOutput
from ditto_fast.live.held import Held, Mute
from ditto_fast.live.options import LiveRequest
from ditto_fast.live.pushed import PushedSource
from ditto_fast.live.start import plate_pix_fmt, stream_live
from ditto_fast.live.stream_audio import IN_JITTER
from ditto_fast.media.rates import BAND_PER_SAMPLE, SPEECH_SAMPLE_RATE, STREAM_SAMPLE_RATE
from ditto_fast.pipecat.face import Face

END_MARGIN_S = 10.0         # at an EndFrame, how long past the speech left and the latency the session may take
STOP_WAIT_S = 30.0          # how long a cancelled session may take to close


class LocalFace(Face):
    """The in-process session behind `DittoFastVideoService` (without `url=`): the engine loaded here (or `renderer`
    shared), a live session on a thread of its own fed the TTS's speech; its frames pushed through `out`."""

    def __init__(self, out: Any, avatar: str, *, checkpoints: str | Path | None = None, home: str | Path | None = None,
                 device: str = "auto", precision: str = "auto", emotion: str | None = None, seed: int | None = None,
                 steps: int | None = None, fps: str | float | None = None, blend: str | None = None,
                 controls: str | Path | None = None, overlap: int | None = None, max_latency: float | None = None,
                 renderer: Any = None) -> None:
        super().__init__(out)
        if home is not None:
            os.environ["DITTO_FAST_HOME"] = str(home)
        self._engine = None if renderer is not None else EngineOptions(checkpoints=checkpoints, device=device,
                                                                        precision=precision)
        config = renderer.config if renderer is not None else self._engine.settings()
        self._request = LiveRequest(avatar=avatar, emotion=emotion, seed=seed, steps=steps, fps=fps, blend=blend,
                                    controls=controls, overlap=overlap, max_latency=max_latency)
        self._request.settings(config)          # refused here, before the pipeline starts
        self._renderer = renderer
        self._ready = False                                    # set up: the engine loaded, the avatar opened
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._pusher: asyncio.Task | None = None
        self._done = asyncio.Event()
        self._thread: threading.Thread | None = None
        self._source: PushedSource | None = None
        self._session = None
        self._stopping = False
        self._summary: dict | None = None
        self._error: BaseException | None = None               # what ended the session, where it failed
        self._resampler: BandResampler | None = None      # to 16 kHz, and in step to the stream's 48 kHz
        self._held = Held()                                    # marked by the source samples given before each
        self._shown = 0                                        # stream samples sent so far (the last slot's end)
        self._mute = Mute()                                    # by stream samples (16 kHz)

    # -- what the session is doing -----------------------------------------------------------------------------
    @property
    def stats(self) -> dict | None:
        """The session's figures (as `live --stats` writes them, and `speech_dropped_s`: the speech interruptions
        dropped): so far while it runs, final once it ended."""
        session, source = self._session, self._source
        summary = session.stats.summary() if self._summary is None and session is not None else self._summary
        if summary is not None and source is not None:
            summary = {**summary, "speech_dropped_s": round(source.dropped / SPEECH_SAMPLE_RATE, 3)}
        return summary

    @property
    def state(self) -> str:
        """The session's state, in live/states.py's words."""
        if self._done.is_set() or (self._stopping and self._thread is None):
            return "failed" if self._error is not None else "ended"
        if self._stopping:
            return "ending"
        return "streaming" if self._session is not None else "starting"

    # -- life ------------------------------------------------------------------------------------------------------
    async def setup(self) -> None:
        """Load the engine (unless one was given) and open the avatar, off the event loop."""
        try:
            if self._renderer is None:
                from ditto_fast.handles.local import load_renderer

                self._renderer = await _in_thread(lambda: load_renderer(self._engine), "ditto-fast-load")
            renderer, name = self._renderer, self._request.avatar
            avatar = await _in_thread(lambda: renderer.avatar(name), "ditto-fast-avatar")
        except Exception as e:
            self._error = e             # no session: the face failed (the pipeline reports it)
            raise
        self._size = avatar.size
        self._rate = self._request.settings(renderer.config, avatar.rate).rate
        self._ready = True

    def _launch(self) -> None:
        """Start the session (once the StartFrame has gone on): the avatar idles until speech comes."""
        if not self._ready or self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._done.clear()
        self._source = PushedSource("the TTS's speech")
        self._pusher = self.out.create_task(self._push_out(), name="ditto-fast-push")
        self._thread = threading.Thread(target=self._stream, name="ditto-fast-session", daemon=True)
        self._thread.start()

    async def end(self, graceful: bool) -> None:
        """End the session; graceful: after the speech given is shown (its held frames go out before the EndFrame)."""
        thread = self._thread
        self._stopping = True
        if thread is None:
            return
        source, session = self._source, self._session
        if graceful:
            self._flush_resampler()
            left = source.available() / SPEECH_SAMPLE_RATE
            source.end()            # the stream closes after the last sample given
            latency = self._request.max_latency or self._renderer.config.live.max_latency
            deadline = time.monotonic() + left + latency + END_MARGIN_S
            while thread.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        if session is not None:
            session.stop()
        source.close()
        deadline = time.monotonic() + STOP_WAIT_S
        while thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if thread.is_alive():
            logger.warning(f"{self.out}: the live session did not end within {STOP_WAIT_S:g} s")
        else:
            thread.join()
        if graceful and not thread.is_alive():
            try:                                # every frame the session sent has been pushed
                await asyncio.wait_for(self._done.wait(), STOP_WAIT_S)
            except TimeoutError:
                logger.warning(f"{self.out}: frames of the session were still on their way at the end")
            for f in self._held.drain():
                await self.out.push_frame(f)
        if self._pusher is not None:
            await self.out.cancel_task(self._pusher)
            self._pusher = None
        self._thread = None

    def _stream(self) -> None:
        """The session, on a thread of its own until it ends."""
        error = None
        try:
            self._summary = stream_live(self._renderer, self._request, self._source,
                                        True, self._log, started=self._started, output=self._output)
        except BaseException as e:  # noqa: BLE001 - reported in the pipeline
            error = e
        self._call_in_loop(self._queue.put_nowait, ("ended", error))

    def _started(self, session) -> None:
        self._session = session
        if self._stopping:
            session.stop()

    def _output(self, avatar, settings) -> FrameOutput:
        self._size, self._rate = avatar.size, settings.rate
        return FrameOutput(avatar.size, plate_pix_fmt(avatar), self._deliver)

    def _log(self, line: str) -> None:
        logger.info(f"{self.out}: {line}")

    def _call_in_loop(self, fn: Callable, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:        # the loop is closed: nobody is left to take the frames
            pass

    # -- speech in --------------------------------------------------------------------------------------------------
    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """TTS audio feeds the session; interruptions clear it; what follows speech waits for it to be shown."""
        if isinstance(frame, StartFrame):
            await self.out.push_frame(frame, direction)
            self._launch()
            return
        if isinstance(frame, TTSAudioRawFrame) and direction == FrameDirection.DOWNSTREAM and self._streaming():
            self._feed(frame)
            return
        if isinstance(frame, (InterruptionFrame, UserStartedSpeakingFrame)):
            self._interrupt()
        elif isinstance(frame, TTSStoppedFrame):
            self._flush_resampler()
        if direction == FrameDirection.DOWNSTREAM and not isinstance(frame, (SystemFrame, EndFrame)) \
                and self._hold(frame):
            return
        await self.out.push_frame(frame, direction)

    def _streaming(self) -> bool:
        """A session takes the speech (else it goes on as it came: the agent still speaks without its face)."""
        return self._source is not None and self._thread is not None and not self._done.is_set()

    def _feed(self, frame: TTSAudioRawFrame) -> None:
        """The TTS's audio to what the model hears (16 kHz) and to the stream's 48 kHz (its band kept)."""
        r = self._resampler
        if r is None or (r.rate, r.channels) != (frame.sample_rate, frame.num_channels):
            self._flush_resampler()
            r = self._resampler = BandResampler(frame.sample_rate, frame.num_channels)
        self._source.push(*r(frame.audio))

    def _flush_resampler(self) -> None:
        if self._resampler is not None and self._source is not None:
            self._source.push(*self._resampler.flush())

    def _interrupt(self) -> None:
        """Drop the speech not yet taken, silence what was taken, let go of the interruptible frames held."""
        if self._source is None:
            return
        if self._resampler is not None:
            self._resampler.flush()                 # its tail belongs to the speech dropped
        self._source.clear()
        session = self._session
        if session is not None and getattr(session, "start", None) is not None:
            due = int((time.monotonic() - session.start - IN_JITTER) * SPEECH_SAMPLE_RATE)      # the stream decided so far
            self._mute.extend(due)
        kept = self._held.interrupt()
        if kept and self._queue is not None:
            self._queue.put_nowait(("frames", kept))

    def _hold(self, frame: Frame) -> bool:
        """Hold `frame` if speech given before it has not all been shown yet; True if held."""
        source = self._source
        if source is None or self._thread is None or self._done.is_set():
            return False
        return self._held.hold(source.received, frame,
                               lambda: not source.available() and self._shown_up_to(source.taken, self._shown))

    def _shown_up_to(self, index: int, shown: int) -> bool:
        """Whether source sample `index - 1` and all before it have left in the stream's first `shown` samples."""
        source, session = self._source, self._session
        if index <= 0:
            return True
        if index > source.taken or session is None or getattr(session, "start", None) is None:
            return False
        taken = source.taken_at(index - 1)
        if taken is None:                           # taken too long ago to be remembered: long shown
            return True
        return shown >= int((taken - session.start - IN_JITTER) * SPEECH_SAMPLE_RATE)

    # -- frames out ---------------------------------------------------------------------------------------------------
    def _deliver(self, i: int, rgb: np.ndarray, pcm: np.ndarray) -> None:
        """On the session's output thread, at slot i's time: the frame, its audio, and the frames held for it."""
        num, den = SPEECH_SAMPLE_RATE * self._rate.denominator, self._rate.numerator
        a, b = i * num // den, (i + 1) * num // den
        if self._mute.muted(a, time.monotonic()):
            pcm = pcm.copy()
            pcm[:int(self._mute.until - a) * BAND_PER_SAMPLE] = 0
        speech = bool(pcm.any())
        self._shown = b
        released = self._held.release(lambda mark: self._shown_up_to(mark, b))
        self._call_in_loop(self._queue.put_nowait, ("slot", rgb.tobytes(), pcm.tobytes(), speech, released))

    async def _push_out(self) -> None:
        """The one task that pushes what the session sends, in order."""
        while True:
            item = await self._queue.get()
            kind = item[0]
            if kind == "slot":
                _, image, pcm, speech, released = item
                await self.out.push_frame(OutputImageRawFrame(image=image, size=self._size, format="RGB"))
                audio = TTSAudioRawFrame if speech else OutputAudioRawFrame
                await self.out.push_frame(audio(audio=pcm, sample_rate=STREAM_SAMPLE_RATE, num_channels=1))
                for f in released:
                    await self.out.push_frame(f)
            elif kind == "frames":
                for f in item[1]:
                    await self.out.push_frame(f)
            elif kind == "ended":
                held = self._held.drain()       # nothing more will be shown: what was held goes on
                self._error = item[1]
                self._done.set()
                for f in held:
                    await self.out.push_frame(f)
                if item[1] is not None:
                    e = item[1]
                    await self.out.push_error(f"the avatar's live session failed: {e}", exception=e,
                                          force_treat_as_permanent=True)


async def _in_thread(fn: Callable[[], Any], name: str) -> Any:
    """fn() on a thread of its own (ended when this returns), awaited without blocking the event loop."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def run() -> None:
        try:
            value, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - raised in the awaiting task
            value, error = None, e
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:
            pass

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    value = await future            # cancelled (a setup timeout): the thread finishes on its own, unjoined
    thread.join()
    return value
