"""What `DittoFastVideoService` delegates to: a face, rendered in this process (local.py) or by a running serve
(remote.py). Both keep back the frames after speech and mute a cut answer through live/held.py, and say their state
in live/states.py's words."""

from __future__ import annotations

from fractions import Fraction
from typing import Any


class Face:
    """A face behind the Pipecat service `out` (whose push_frame, push_error, create_task and cancel_task it uses):
    `setup` before the pipeline starts, `process_frame` for each frame the service gets, `end` at its end."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self._size: tuple[int, int] | None = None
        self._rate = Fraction(25)

    async def setup(self) -> None:
        """Ready what the face needs before its first frame (nothing, unless it loads something)."""

    async def process_frame(self, frame: Any, direction: Any) -> None:
        raise NotImplementedError

    async def end(self, graceful: bool) -> None:
        """End the session; graceful: once the speech given has been shown (idempotent)."""
        raise NotImplementedError

    @property
    def state(self) -> str:
        raise NotImplementedError

    @property
    def size(self) -> tuple[int, int] | None:
        """The frames' (width, height), once known (the avatar set up, or the first frame come)."""
        return self._size

    @property
    def rate(self) -> Fraction:
        """Frames per second (the avatar's, or `fps`), once known."""
        return self._rate

    @property
    def stats(self) -> dict | None:
        return None

    @property
    def session(self) -> str | None:
        return None
