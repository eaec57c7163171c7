"""A live stream handed to the caller in process, frame by frame, instead of to ffmpeg: what a Pipecat pipeline (or any
consumer in the same process) takes. The same face to the session as outputs.StreamOutput (write, close, abort,
alive)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ditto_fast.media.yuv import Layout, planes_to_rgb


class FrameOutput:
    """Each frame the session sends, its plate planes (`pix_fmt`, a yuv.Layout name) turned into RGB [H, W, 3] uint8,
    handed with its slot's int16 16 kHz mono speech to `deliver(index, rgb, pcm)` on the session's output thread, at
    the slot's time. `deliver` must not wait long (it holds the stream's clock); an exception it raises ends the
    session as a failed output does. `ended(clean)` is called once, at close (True) or abort (False)."""

    def __init__(self, size: tuple[int, int], pix_fmt: str, deliver: Callable[[int, np.ndarray, np.ndarray], None],
                 ended: Callable[[bool], None] | None = None) -> None:
        self.size = (int(size[0]), int(size[1]))
        self.layout = Layout(pix_fmt)
        self._deliver, self._ended = deliver, ended
        self.frames_written = 0
        self.samples_written = 0
        self._closed = False

    def alive(self) -> bool:
        """Not yet closed or aborted."""
        return not self._closed

    def write(self, frame: np.ndarray, audio: np.ndarray) -> None:
        """Hand on one frame (planes in the layout) and the int16 samples of its duration."""
        if self._closed:
            raise ValueError("write() on a closed FrameOutput")
        rows, cols = self.layout.shape(*self.size)
        if frame.shape != (rows, cols):
            raise ValueError(f"a {self.layout.pix_fmt} frame of {self.size[0]}x{self.size[1]} is [{rows}, {cols}], "
                             f"got {frame.shape}")
        pcm = np.asarray(audio, np.int16)
        self._deliver(self.frames_written, planes_to_rgb(frame, self.layout), pcm)
        self.frames_written += 1
        self.samples_written += len(pcm)

    def close(self) -> None:
        """The stream ended cleanly (idempotent)."""
        self._finish(True)

    def abort(self) -> None:
        """The stream failed (idempotent)."""
        self._finish(False)

    def _finish(self, clean: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self._ended is not None:
            self._ended(clean)
