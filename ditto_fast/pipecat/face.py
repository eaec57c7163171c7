"""The lifecycle both faces share (in process, and on a running serve): an EndFrame lets the speech given be shown,
a CancelFrame or cleanup ends the session at once."""

from __future__ import annotations

from pipecat.frames.frames import CancelFrame, EndFrame
from pipecat.services.ai_service import AIService


class FaceService(AIService):
    """A Pipecat service that carries a live session; subclasses say how it ends (`_end`)."""

    async def stop(self, frame: EndFrame) -> None:
        """Let the speech already given be shown, then end the session."""
        await super().stop(frame)
        await self._end(graceful=True)

    async def cancel(self, frame: CancelFrame) -> None:
        """End the session at once."""
        await super().cancel(frame)
        await self._end(graceful=False)

    async def cleanup(self) -> None:
        """End the session if it still runs (idempotent)."""
        await super().cleanup()
        await self._end(graceful=False)

    async def _end(self, graceful: bool) -> None:
        raise NotImplementedError
