"""A live stream handed to the caller in process, frame by frame, instead of to ffmpeg: what a Pipecat pipeline (or any
consumer in the same process) takes. The same face to the session as outputs.StreamOutput (write, close, abort,
alive)."""

from __future__ import annotations

import queue
import threading
from typing import Callable

import numpy as np

from ditto_fast.media.yuv import Layout, planes_to_rgb

QUEUED_FRAMES = 4           # frames waiting for their RGB before write() waits


class FrameOutput:
    """Each frame the session sends, its plate planes (`pix_fmt`, a yuv.Layout name) turned into RGB [H, W, 3] uint8,
    handed with its slot's int16 48 kHz mono speech (the stream's audio) to `deliver(index, rgb, pcm)`, in order.

    The conversion and `deliver` run on a thread of their own (a 1080p frame's RGB takes the time of its putback),
    so the session's frame clock never waits for them unless QUEUED_FRAMES are behind. `deliver` should not wait
    long; an exception it raises is raised by the next write() or by close(), and the session fails as it does on a
    broken ffmpeg. `ended(clean)` is called once, at close (True) or abort (False), after the last delivery.
    """

    def __init__(self, size: tuple[int, int], pix_fmt: str, deliver: Callable[[int, np.ndarray, np.ndarray], None],
                 ended: Callable[[bool], None] | None = None) -> None:
        self.size = (int(size[0]), int(size[1]))
        self.layout = Layout(pix_fmt)
        self._deliver, self._ended = deliver, ended
        self.frames_written = 0
        self.samples_written = 0
        self._closed = False
        self._error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUED_FRAMES)
        self._drop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-frames-rgb", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while (item := self._queue.get()) is not None:
            if self._drop.is_set() or self._error is not None:
                continue
            frame, pcm = item
            try:
                self._deliver(i, planes_to_rgb(frame, self.layout), pcm)
            except BaseException as e:  # noqa: BLE001 - raised on the session's thread
                self._error = e
            i += 1

    def alive(self) -> bool:
        """Not yet closed or aborted, and `deliver` has not failed."""
        return not self._closed and self._error is None

    def write(self, frame: np.ndarray, audio: np.ndarray) -> None:
        """Hand on one frame (planes in the layout; not changed afterwards) and the int16 samples of its duration."""
        if self._closed:
            raise ValueError("write() on a closed FrameOutput")
        if self._error is not None:
            raise self._error
        rows, cols = self.layout.shape(*self.size)
        if frame.shape != (rows, cols):
            raise ValueError(f"a {self.layout.pix_fmt} frame of {self.size[0]}x{self.size[1]} is [{rows}, {cols}], "
                             f"got {frame.shape}")
        pcm = np.asarray(audio, np.int16)
        self._queue.put((frame, pcm))
        self.frames_written += 1
        self.samples_written += len(pcm)

    def close(self) -> None:
        """Deliver what is queued, then end (idempotent); raises what `deliver` raised."""
        self._finish(True)
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """End without delivering what is queued (idempotent)."""
        self._drop.set()
        self._finish(False)

    def _finish(self, clean: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        if self._ended is not None:
            self._ended(clean and self._error is None)
