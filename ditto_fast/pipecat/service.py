"""`DittoFastVideoService`: a Pipecat service, placed after the TTS, that gives the agent's speech a face: rendered
on this machine (local.py: the same live session as `ditto-fast live`), or by a running `ditto-fast serve` given
`url=` (remote.py: this process then loads no network). One class; the face it delegates to is picked when it is
made."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from pipecat.frames.frames import CancelFrame, EndFrame, Frame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.ai_service import AIService
from pipecat.services.settings import ServiceSettings

from ditto_fast.pipecat.face import Face

LOCAL_OPTIONS = ("checkpoints", "home", "device", "precision", "emotion", "seed", "steps", "fps", "blend", "controls",
                 "overlap", "max_latency", "renderer")


class DittoFastVideoService(AIService):
    """A talking face for a Pipecat pipeline, after the TTS: `TTSAudioRawFrame`s (any rate, mono or stereo) in;
    `OutputImageRawFrame`s (the avatar's size, RGB) and the same speech as 48 kHz mono audio frames out (its band as
    the TTS spoke it), one of each per frame at the avatar's rate, from the start (the avatar idles: breathes,
    blinks) to the end.

    The audio of a frame that carries speech is a `TTSAudioRawFrame`, of one that does not a plain
    `OutputAudioRawFrame` of silence (so an output transport knows when the bot speaks). An `InterruptionFrame` or
    `UserStartedSpeakingFrame` drops the speech not yet taken in and silences at once what was taken but not yet
    shown; the face is idle again within the session's latency (at most `max_latency`). `EndFrame` lets the speech
    already given finish, then ends; `CancelFrame` ends at once.

    `url="http://HOST:8750"` (and `token=`) has a running `ditto-fast serve` render the face instead: this process
    then loads no network (pipecat/remote.py). Otherwise `avatar` names a registered avatar; `checkpoints`,
    `device`, `precision` are the engine's (as `render` takes them), or `renderer` shares an engine already loaded;
    `home` is the avatar store ($DITTO_FAST_HOME, set for this process). `emotion`, `seed`, `steps`, `fps`, `blend`,
    `controls`, `overlap` and `max_latency` are `live`'s settings (None: the config's). Bad settings raise
    UsageError here; an unknown avatar or missing checkpoints are reported when the pipeline sets the service up
    (the engine loads then: give a `renderer` loaded before, or a `setup_timeout_secs` above the load time, where
    loading takes longer than the worker's 20 s default). Other keywords are Pipecat's (in process only).
    """

    def __init__(self, avatar: str, *, url: str | None = None, token: str | None = None, **options: Any) -> None:
        if url is not None:
            from ditto_fast.pipecat.remote import RemoteFace

            super().__init__(settings=ServiceSettings(model=None))
            self._face: Face = RemoteFace(self, avatar, url=url, token=token, **options)
            return
        from ditto_fast.pipecat.local import LocalFace

        if token is not None:
            options["token"] = token
        kwargs = {k: options.pop(k) for k in list(options) if k not in LOCAL_OPTIONS}
        super().__init__(settings=ServiceSettings(model=None), **kwargs)
        self._face = LocalFace(self, avatar, **options)

    # -- what the face is doing ------------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """The live session's state, in live/states.py's words (starting, streaming, ending, ended, failed)."""
        return self._face.state

    @property
    def stats(self) -> dict | None:
        """The in-process session's figures (as `live --stats` writes them, and `speech_dropped_s`): so far while it
        runs, final once it ended; None for a face a serve renders."""
        return self._face.stats

    @property
    def size(self) -> tuple[int, int] | None:
        """The frames' (width, height), once known."""
        return self._face.size

    @property
    def rate(self) -> Fraction:
        """Frames per second (the avatar's, or `fps`), once known."""
        return self._face.rate

    @property
    def session(self) -> str | None:
        """The serve's id of the live session rendering the face (None in process, and while there is none)."""
        return self._face.session

    # -- life ------------------------------------------------------------------------------------------------------
    async def setup(self, setup: FrameProcessorSetup) -> None:
        """Ready the face: in process, load the engine (unless one was given) and open the avatar."""
        await super().setup(setup)
        await self._face.setup()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self._face.process_frame(frame, direction)

    async def stop(self, frame: EndFrame) -> None:
        """Let the speech already given be shown, then end the session."""
        await super().stop(frame)
        await self._face.end(graceful=True)

    async def cancel(self, frame: CancelFrame) -> None:
        """End the session at once."""
        await super().cancel(frame)
        await self._face.end(graceful=False)

    async def cleanup(self) -> None:
        """End the session if it still runs (idempotent)."""
        await super().cleanup()
        await self._face.end(graceful=False)
