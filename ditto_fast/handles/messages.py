"""The messages between a parent and its engine process, one small class each (pickled over their socket): a render
job's (start, render, its progress, the commit handshake, its outcome) and a live session's, each of which names its
session (`SessionMessage.id`). Speech travels as `Speech`; everything else about a session is control, which a
clear never drops (see live_link.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ditto_fast.handles.base import EngineJob
    from ditto_fast.handles.live_link import SessionOrder


# ---------------------------------------------------------------------- to the engine: its life and its render jobs
@dataclass(frozen=True)
class Start:
    """The first message: the resolved setup to load, and the cap on the process's memory (None: none)."""
    setup: Any
    memory_bytes: int | None


@dataclass(frozen=True)
class Render:
    job: EngineJob


@dataclass(frozen=True)
class Cancel:
    """Stop the render `token` (at its next frame batch, or instead of its rename)."""
    token: str


@dataclass(frozen=True)
class Go:
    """The render `token` may rename its finished file into place."""
    token: str


@dataclass(frozen=True)
class Stop:
    """End every session cleanly, then exit."""


# ---------------------------------------------------------------------- from the engine: its life and its render jobs
@dataclass(frozen=True)
class Beat:
    time: float


@dataclass(frozen=True)
class Ready:
    info: dict


@dataclass(frozen=True)
class Failed:
    """The engine could not start: its line and exit code."""
    line: str
    exit_code: int


@dataclass(frozen=True)
class Progress:
    token: str
    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class Commit:
    """The render `token`'s file is complete: it waits for Go or Cancel before its rename."""
    token: str


@dataclass(frozen=True)
class Outcome:
    """The render `token` ended: `outcome` as outcome.py makes it (done, error, cancelled, fatal)."""
    token: str
    outcome: tuple


# ---------------------------------------------------------------------- a live session's, both ways
@dataclass(frozen=True)
class SessionMessage:
    id: str


@dataclass(frozen=True)
class Open(SessionMessage):
    """Start the session `order` (its id is the order's)."""
    order: SessionOrder


@dataclass(frozen=True)
class Speech(SessionMessage):
    """Speech for the session: s16le at 16 kHz (what the model hears) and the same at 48 kHz (`band`, or None)."""
    pcm: bytes
    band: bytes | None


@dataclass(frozen=True)
class SegmentEnd(SessionMessage):
    """The speech up to sample `at` (16 kHz, counted from the session's start, cleared speech included) is one
    answer: its playback_finished comes once it has gone out."""
    at: int


@dataclass(frozen=True)
class Clear(SessionMessage):
    """An interruption: the speech not yet spoken is dropped; answered by a `cleared` event."""


@dataclass(frozen=True)
class Watch(SessionMessage):
    """How many watch the session now (the engine encodes its frames only while any do)."""
    watchers: int


@dataclass(frozen=True)
class End(SessionMessage):
    """End the stream now, cleanly (its file complete); `why` is the stats' `ended_by`."""
    why: str = "stop"


@dataclass(frozen=True)
class SessionReady(SessionMessage):
    info: dict


@dataclass(frozen=True)
class SessionStats(SessionMessage):
    """The session's figures (each second), the samples it has taken of its speech and those of them its stream
    has not sent yet (what it still has to say)."""
    summary: dict
    taken: int
    unsent: int = 0


@dataclass(frozen=True)
class SessionLog(SessionMessage):
    line: str


@dataclass(frozen=True)
class SessionEvent(SessionMessage):
    """A playback event (started, finished, cleared) for the session's client."""
    event: dict


@dataclass(frozen=True)
class SessionMedia(SessionMessage):
    """One frame while anyone watches: its index, its picture as one H.264 access unit, whether that is a key frame,
    its slot's s16le speech at 48 kHz."""
    index: int
    unit: bytes
    key: bool
    pcm: bytes

    @property
    def media(self) -> tuple:
        return self.index, self.unit, self.key, self.pcm


@dataclass(frozen=True)
class SessionEnded(SessionMessage):
    summary: dict


@dataclass(frozen=True)
class SessionFailed(SessionMessage):
    line: str
    exit_code: int
