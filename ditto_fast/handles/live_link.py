"""A live session ordered of an engine (`SessionOrder`: its request and id), and the parent's side of it there
(`LiveLink`): speech pushed to it (16 kHz, as the model hears it), cleared on an interruption, ended; the session
stopped; its state (live/states.py's words), figures and cause read. What the
session says comes back through the engine's handle (`heard`), which also tells the link when its engine is lost.

The messages (messages.py) leave on two channels: the speech, and the control (an answer's end, a clear, the
watchers, the stop), which goes first and which a clear never touches: a clear drops only the speech not yet sent.
An answer's end names its place in the speech (`SegmentEnd.at`), so it may overtake the speech before it."""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ditto_fast.handles import messages as m
from ditto_fast.live.states import ACTIVE
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE

if TYPE_CHECKING:
    from ditto_fast.handles.base import EngineState
    from ditto_fast.live.options import LiveRequest

@dataclass(frozen=True)
class SessionOrder:
    """A live session ordered of an engine, to carry beside its render jobs: the session's checked request; `id`
    names it in every message about it."""

    request: LiveRequest
    label: str = ""                     # what the session is called where it came from (serve's session id)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])




class LiveLink:
    """One live session on an engine, seen from the process that opened it. `send` hands a message to the engine
    (OSError when it is gone); `heard(event, detail)` hears ready, log, event (playback), ended and failed."""

    def __init__(self, order: SessionOrder, send: Callable[[Any], None], engine: str,
                 heard: Callable[[str, Any], None] | None = None):
        self.order, self.id, self.engine = order, order.id, engine
        self.heard = heard or (lambda event, detail: None)
        self.state, self.error = "starting", None
        self.info: dict[str, Any] = {}         # what the engine said when the session started
        self.stats: dict | None = None          # the session's figures, each second, and at its end
        self.pushed = 0                         # samples pushed (16 kHz), less those a clear dropped before sending
        self.taken = 0                          # samples the session has taken, as it last said
        self.unsent = 0                         # of them, those its stream had not sent yet, as it last said
        self.last_frames, self.last_change = -1, time.monotonic()      # for the stall limit
        self._send = send
        self._watchers: list[Callable[[tuple | None], None]] = []
        self._speech: deque[m.Speech] = deque()
        self._control: deque[m.SessionMessage] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._sender = threading.Thread(target=self._send_loop, name=f"live-{self.id}-send", daemon=True)
        self._sender.start()

    # ------------------------------------------------------------------ to the session
    def push(self, samples: np.ndarray, band: np.ndarray | None = None) -> None:
        """Speech for the session: float32 samples in [-1, 1) at 16 kHz, what the model hears, and `band`, the same
        speech as it came at 48 kHz for the stream to carry (sent in order; dropped once the session ended)."""
        if not self.active or not (len(samples) or (band is not None and len(band))):
            return                  # (the two resamplers give their samples in different lumps: either may be empty)
        message = m.Speech(self.id, _s16(samples), None if band is None else _s16(band))
        with self._wake:
            self.pushed += len(samples)
            self._speech.append(message)
            self._wake.notify()

    def clear(self) -> None:
        """Drop the speech not yet spoken (an interruption): what waits here and what waits in the engine; the
        engine answers with a `cleared` event. Nothing but speech is dropped."""
        with self._wake:
            self.pushed -= sum(len(s.pcm) // 2 for s in self._speech)
            self._speech.clear()
        self._say(m.Clear(self.id))

    def end_segment(self) -> None:
        """The speech pushed so far ends a segment (an answer): its playback_finished comes once it has gone out."""
        with self._wake:
            at = self.pushed
        self._say(m.SegmentEnd(self.id, at))

    def stop(self, why: str = "stop") -> None:
        """End the stream now, cleanly (its file complete); `why` is what its figures say ended it; `wait` for it."""
        with self._lock:
            if self.state not in ACTIVE:
                return
            self.state = "ending"
        self._say(m.End(self.id, why))

    def watch(self, take: Callable[[tuple | None], None]) -> Callable[[], None]:
        """`take((index, access_unit, key, pcm))` hears each frame the session sends from now on (its picture as one
        H.264 access unit, a key frame first; its slot's int16 speech), then `take(None)` when the session ends; the
        engine encodes only while anyone watches. Returns what stops the watching (a session that has ended tells a
        watcher so at once)."""
        with self._lock:
            ended = not self.active
            if not ended:
                self._watchers.append(take)
                count = len(self._watchers)
        if ended:
            _quietly(take, None)
            return lambda: None
        self._say(m.Watch(self.id, count))

        def leave() -> None:
            with self._lock:
                if take not in self._watchers:
                    return
                self._watchers.remove(take)
                count = len(self._watchers)
            self._say(m.Watch(self.id, count))
        return leave

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the session has ended or failed; whether it has."""
        return self._ended.wait(timeout)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def queued_seconds(self) -> float:
        """Seconds of speech pushed and not yet taken by the session (as it said within the last second)."""
        return max(0, self.pushed - self.taken) / SPEECH_SAMPLE_RATE

    @property
    def speaking(self) -> bool:
        """Whether the session has speech left to say: pushed and not taken, or taken and not yet sent (its delay)."""
        return self.pushed > self.taken or self.unsent > 0

    # ------------------------------------------------------------------ from the engine
    def hear(self, message: m.SessionMessage) -> None:
        """A message about this session from its engine (`heard` hears ready, log, event, ended, failed)."""
        if isinstance(message, m.SessionMedia):
            for take in list(self._watchers):
                _quietly(take, message.media)
        elif isinstance(message, m.SessionStats):
            self.stats, self.taken, self.unsent = message.summary, message.taken, message.unsent
            frames = (self.stats.get("frames") or {}).get("sent", 0)
            if frames != self.last_frames:
                self.last_frames, self.last_change = frames, time.monotonic()
        elif isinstance(message, m.SessionEvent):
            _quietly(self.heard, "event", message.event)
        elif isinstance(message, m.SessionReady):
            self.info = message.info
            with self._lock:
                if self.state == "starting":
                    self.state = "streaming"
            _quietly(self.heard, "ready", self.info)
        elif isinstance(message, m.SessionLog):
            _quietly(self.heard, "log", message.line)
        elif isinstance(message, m.SessionEnded):
            self.stats = message.summary
            self._finish("ended", None)
        elif isinstance(message, m.SessionFailed):
            self._finish("failed", message.line)

    def lost(self, why: str) -> None:
        """The engine carrying the session is gone (`why`: its death, a hang, its stop)."""
        self._finish("failed", f"its engine {self.engine} {why}")

    def _finish(self, state: str, error: str | None) -> None:
        with self._lock:
            if self.state not in ACTIVE:
                return
            self.state, self.error = state, error
        with self._wake:
            self._closed = True
            self._speech.clear()
            self._wake.notify()
        self._ended.set()
        for take in list(self._watchers):
            _quietly(take, None)
        _quietly(self.heard, state, error if state == "failed" else self.stats)

    def _say(self, message: m.SessionMessage) -> None:
        with self._wake:
            self._control.append(message)
            self._wake.notify()

    def _send_loop(self) -> None:
        """Hand the messages to the engine, the control before the speech, each channel in order (a stopped engine
        blocks this thread, never the caller's)."""
        while True:
            with self._wake:
                while not (self._control or self._speech or self._closed):
                    self._wake.wait()
                if self._closed:
                    return
                message = (self._control or self._speech).popleft()
            try:
                self._send(message)
            except Exception:  # noqa: BLE001 - the engine is gone: its handle says so through lost()
                return


def state_with(state: EngineState, links: dict[str, LiveLink]) -> EngineState:
    """A copy of an engine's `state` naming the sessions of `links` still active (their orders' labels, or ids): a
    link told its end is off the list at once, and what other threads change later leaves the copy be."""
    carried = list(links.values())          # a copy: other threads add and drop links
    return replace(state, sessions=[link.order.label or link.id for link in carried if link.active])


def _s16(samples: np.ndarray) -> bytes:
    return np.clip(np.round(np.asarray(samples, np.float32) * 32768.0), -32768, 32767).astype("<i2").tobytes()


def _quietly(listener: Callable[..., None], *said: Any) -> None:
    """Tell one listener (a watcher, `heard`); its failure is its own (the others and the engine's reader go on)."""
    try:
        listener(*said)
    except Exception:  # noqa: BLE001 - a viewer gone mid-frame, say
        pass
