"""A stand-in TTS for trying a pipeline with no network: it speaks a WAV file as a TTS engine streams its answer."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
from pipecat.frames.frames import Frame, TTSAudioRawFrame, TTSSpeakFrame, TTSStartedFrame, TTSStoppedFrame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from ditto_fast.core.errors import InputError


class WavSpeaker(FrameProcessor):
    """On each `TTSSpeakFrame` (whatever its text), the WAV at `path` (16-bit PCM, any rate, mono or stereo) as
    `TTSAudioRawFrame`s of `chunk_s` seconds, between `TTSStartedFrame` and `TTSStoppedFrame`, at the pace it is
    spoken and `lead` seconds ahead of it (a TTS engine streams ahead a little). An interruption cuts it short, as it
    does a TTS service. `first_audio_at` is the time.monotonic() of its first audio frame."""

    def __init__(self, path: str | Path, chunk_s: float = 0.02, lead: float = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        import soundfile as sf

        try:
            pcm, self.sample_rate = sf.read(str(path), dtype="int16", always_2d=True)
        except (OSError, RuntimeError) as e:
            raise InputError(f"{path}: cannot read it as a WAV file ({e}); give a 16-bit PCM WAV") from None
        self.channels = pcm.shape[1]
        self.pcm = np.ascontiguousarray(pcm)
        self.chunk_s, self.lead = chunk_s, lead
        self.first_audio_at: float | None = None

    @property
    def seconds(self) -> float:
        """How long the WAV speaks."""
        return len(self.pcm) / self.sample_rate

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSSpeakFrame):
            await self._speak()
        else:
            await self.push_frame(frame, direction)

    async def _speak(self) -> None:
        await self.push_frame(TTSStartedFrame())
        step = max(1, int(round(self.chunk_s * self.sample_rate)))
        t0 = time.monotonic()
        for k, at in enumerate(range(0, len(self.pcm), step)):
            await asyncio.sleep(max(0.0, t0 + k * step / self.sample_rate - self.lead - time.monotonic()))
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
            await self.push_frame(TTSAudioRawFrame(audio=self.pcm[at:at + step].tobytes(),
                                                   sample_rate=self.sample_rate, num_channels=self.channels))
        await self.push_frame(TTSStoppedFrame())
