"""What a face in an agent's pipeline keeps back while its speech is on its way (both Pipecat services: in process and
on a running serve), as plain bookkeeping with no Pipecat in it: `Held`, the frames that follow speech, held until
that speech has been shown; `Mute`, the window of the stream whose speech an interruption cut, sent out silent.

A mark is the caller's own monotonic number for "the speech given so far" (the in-process service: source samples
received; the remote one: the utterance's number); a position is the stream's (samples out, or a frame's index)."""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Any, Callable


class Held:
    """Frames held, in order, each with the mark of the speech given before it; released from the front as that
    speech is shown; on an interruption only the frames that are not interruptible are kept (and let go). Safe to
    use from two threads (the session's output and the event loop)."""

    def __init__(self) -> None:
        self._frames: deque[tuple[Any, Any]] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._frames)

    def hold(self, mark: Any, frame: Any, shown: Callable[[], bool] = lambda: False) -> bool:
        """Hold `frame` (after the speech up to `mark`) unless that speech is `shown()` and nothing waits before it;
        True if held."""
        with self._lock:
            if self._frames or not shown():
                self._frames.append((mark, frame))
                return True
        return False

    def release(self, shown: Callable[[Any], bool]) -> list:
        """The frames, from the front, whose mark's speech is `shown(mark)`; the first that is not stops it."""
        out = []
        with self._lock:
            while self._frames and shown(self._frames[0][0]):
                out.append(self._frames.popleft()[1])
        return out

    def through(self, mark: Any) -> list:
        """The frames whose speech up to `mark` or before it has been shown."""
        return self.release(lambda held: held <= mark)

    def interrupt(self) -> list:
        """An interruption: the held frames go; those that are not interruptible are returned, to be passed on."""
        with self._lock:
            frames, self._frames = self._frames, deque()
        return [f for _, f in frames if not getattr(f, "interruptible", True)]

    def drain(self) -> list:
        """Every frame held (the speech will not be shown: the session ended, or its connection was lost)."""
        with self._lock:
            frames, self._frames = self._frames, deque()
        return [f for _, f in frames]


class Mute:
    """The stream's positions before `until` carry speech an interruption cut: they go out silent. Where the stream's
    far end will say where the cut speech ends (serve's `cleared` event), `unknown` mutes everything until it says
    (`said`), or until `deadline` passes, from which the next position is heard again."""

    def __init__(self) -> None:
        self.until: float = 0
        self.deadline: float | None = None

    def extend(self, until: float) -> None:
        """Positions before `until` are muted (a later interruption's window only grows the window)."""
        self.until, self.deadline = max(self.until, until), None

    def unknown(self, now: float, wait: float) -> None:
        """An interruption whose end the far end will say: all muted, at most until `now + wait`."""
        self.until, self.deadline = math.inf, now + wait

    def said(self, until: float) -> None:
        """The far end says the cut speech ends before position `until`."""
        self.until, self.deadline = until, None

    def end(self, position: float, now: float) -> float:
        """Where the window ends, as seen from `position` at `now`: an unknown end past its deadline ends here."""
        if self.until == math.inf and self.deadline is not None and now > self.deadline:
            self.until, self.deadline = position, None
        return self.until

    def muted(self, position: float, now: float) -> bool:
        """Whether `position` goes out silent."""
        return position < self.end(position, now)
