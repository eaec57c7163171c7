"""The pipeline's picture and sound written to an .mp4: where a transport would show the agent, a file shows it."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import imageio_ffmpeg
import numpy as np
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from ditto_fast.audio.resample import Resampler
from ditto_fast.core.errors import InputError
from ditto_fast.encoding.writer import check_output_path
from ditto_fast.live.outputs import FILE_FIX, StreamOutput
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE


class Mp4Recorder(FrameProcessor):
    """Writes the `OutputImageRawFrame`s (RGB, one size) at `rate` frames per second (a number, or a callable asked
    at the first frame: the video service's rate) and the output audio frames (mono or stereo, resampled to the
    first one's rate) to `path` (.mp4: H.264 and AAC), finished at the EndFrame or CancelFrame. Frames go on
    downstream. `images` and `audio_seconds` count what it took; `first_speech_at` is the time.monotonic() at which
    the picture of the first frame that carried speech came (the image before the first TTSAudioRawFrame)."""

    def __init__(self, path: str | Path, rate: float | Fraction | Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_output_path(path, example="agent.mp4")
        self.path = Path(path)
        self._rate = rate
        self._ts = self.path.with_name(self.path.name + ".part.ts")
        self._out: StreamOutput | None = None
        self._size: tuple[int, int] | None = None
        self._sample_rate: int | None = None
        self._resampler: Resampler | None = None
        self._audio: list[np.ndarray] = []
        self._pending: bytes | None = None
        self._writes: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None
        self.images = 0
        self.audio_samples = 0
        self.first_speech_at: float | None = None
        self._image_at: float | None = None

    @property
    def audio_seconds(self) -> float:
        """Seconds of audio taken."""
        return self.audio_samples / self._sample_rate if self._sample_rate else 0.0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputImageRawFrame) and direction == FrameDirection.DOWNSTREAM:
            self._image_at = time.monotonic()
            self._image(frame)
        elif isinstance(frame, OutputAudioRawFrame) and direction == FrameDirection.DOWNSTREAM:
            if isinstance(frame, TTSAudioRawFrame) and self.first_speech_at is None and self._image_at is not None:
                self.first_speech_at = self._image_at
            self._sound(frame)
        elif isinstance(frame, (EndFrame, CancelFrame)):
            await self._finish()
        await self.push_frame(frame, direction)

    def _image(self, frame: OutputImageRawFrame) -> None:
        if self._size is None:
            self._size = tuple(frame.size)
            rate = self._rate() if callable(self._rate) else self._rate
            self._writer = threading.Thread(target=self._write, args=(Fraction(rate),), name="mp4-recorder",
                                            daemon=True)
            self._writer.start()
        elif tuple(frame.size) != self._size:
            raise ValueError(f"{self.path}: a frame of {frame.size} after frames of {self._size}; one size per file")
        if self._pending is not None:
            self._writes.put((self._pending, self._take_audio()))
        self._pending = frame.image
        self.images += 1

    def _sound(self, frame: OutputAudioRawFrame) -> None:
        if self._sample_rate is None:
            self._sample_rate = frame.sample_rate
        r = self._resampler
        if r is None or (r.rate, r.channels) != (frame.sample_rate, frame.num_channels):
            r = self._resampler = Resampler(frame.sample_rate, frame.num_channels, to=self._sample_rate)
        x = r(frame.audio)
        self._audio.append(np.clip(np.round(x * 32768.0), -32768, 32767).astype(np.int16))
        self.audio_samples += len(x)

    def _take_audio(self) -> np.ndarray:
        pcm = np.concatenate(self._audio) if self._audio else np.zeros(0, np.int16)
        self._audio = []
        return pcm

    def _write(self, rate: Fraction) -> None:
        """The writer thread: frames to ffmpeg (a .ts as it comes) until None."""
        try:
            while (item := self._writes.get()) is not None:
                image, pcm = item
                if self._out is None:
                    self._out = StreamOutput(str(self._ts), self._size, rate, "rgb24", preset="ultrafast",
                                             audio_sample_rate=self._sample_rate or SPEECH_SAMPLE_RATE)
                self._out.write(np.frombuffer(image, np.uint8), pcm)
            if self._out is not None:
                self._out.close()
        except BaseException as e:  # noqa: BLE001 - reported at the end
            self._error = e
            if self._out is not None:
                self._out.abort()

    async def _finish(self) -> None:
        if self._writer is None:
            return
        if self._pending is not None:
            self._writes.put((self._pending, self._take_audio()))
            self._pending = None
        self._writes.put(None)
        while self._writer.is_alive():
            await asyncio.sleep(0.02)
        self._writer.join()
        self._writer = None
        if self._error is None and self._ts.exists():
            res = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error",
                                  "-y", "-i", str(self._ts), "-c", "copy", "-movflags", "+faststart", str(self.path)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                said = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
                self._error = InputError(f"{self.path}: ffmpeg could not write the .mp4 ({said}); {FILE_FIX}")
        self._ts.unlink(missing_ok=True)
        if self._error is not None:
            await self.push_error(f"recording to {self.path} failed: {self._error}", exception=self._error)
