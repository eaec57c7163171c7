"""A live stream handed back to whoever watches it, frame by frame: each frame encoded as one H.264 access unit
(Annex B, constrained baseline, no B-frames, SPS and PPS with every key frame: what WebRTC carries and any decoder
joins) with the speech of its slot (48 kHz), given to `send` — an engine's session sends them to the process that opened it
(serve's WebRTC viewers, a remote agent). Encoding runs only while someone watches; a new watcher gets a key frame
at once. `Outputs` hands one session's frames to several outputs (a file and the watchers)."""

from __future__ import annotations

import queue
import threading
from fractions import Fraction
from typing import Callable

import numpy as np

from ditto_fast.media.yuv import Layout, planes_to_rgb

QUEUED_FRAMES = 8           # frames waiting for their encode before write() waits
GOP_SECONDS = 2.0           # a key frame at least this often (a lost packet heals within it)


class RelayOutput:
    """Frames (plate planes, `pix_fmt`) and their slot's int16 speech to `send(index, access_unit, key, pcm)`, the
    picture encoded by x264 (PyAV) while `watch(n)` says someone watches; the same face as StreamOutput (write, close,
    abort, alive)."""

    def __init__(self, size: tuple[int, int], rate: Fraction, pix_fmt: str,
                 send: Callable[[int, bytes, bool, bytes], None], preset: str = "veryfast") -> None:
        self.size, self.rate, self.layout = (int(size[0]), int(size[1])), Fraction(rate), Layout(pix_fmt)
        self._send, self._preset = send, preset
        self.frames_written = 0
        self.samples_written = 0
        self._watchers = 0
        self._key = threading.Event()           # the next frame encoded is a key frame
        self._codec = None
        self._closed = False
        self._error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUED_FRAMES)
        self._thread = threading.Thread(target=self._run, name="live-relay", daemon=True)
        self._thread.start()

    def watch(self, watchers: int) -> None:
        """How many watch now: none stops the encoding; one more starts it with a key frame."""
        if watchers > self._watchers:
            self._key.set()
        self._watchers = watchers

    def alive(self) -> bool:
        return not self._closed and self._error is None

    def write(self, frame: np.ndarray, audio: np.ndarray) -> None:
        """One frame (planes in the layout; not changed afterwards) and the int16 samples of its slot."""
        if self._closed:
            raise ValueError("write() on a closed RelayOutput")
        if self._error is not None:
            raise self._error
        pcm = np.asarray(audio, np.int16)
        self._queue.put((self.frames_written, frame, pcm))
        self.frames_written += 1
        self.samples_written += len(pcm)

    def close(self) -> None:
        """Send what is queued, then end (idempotent); raises what the encoder or `send` raised."""
        self._finish()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue
            index, frame, pcm = item
            try:
                if self._watchers > 0:
                    unit, key = self._encode(frame)
                    self._send(index, unit, key, pcm.astype("<i2").tobytes())
            except BaseException as e:  # noqa: BLE001 - raised on the session's thread
                self._error = e

    def _encode(self, planes: np.ndarray) -> tuple[bytes, bool]:
        """One frame as one access unit (a key frame when asked for, and every GOP_SECONDS)."""
        import av

        if self._codec is None:
            self._codec = _h264(self.size, self.rate, self._preset)
            self._key.set()
        if self.layout.pix_fmt == "yuv420p":
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(planes), format="yuv420p")
        else:                   # 4:2:2 or 10-bit plates: through RGB to WebRTC's 4:2:0 8-bit
            frame = av.VideoFrame.from_ndarray(planes_to_rgb(planes, self.layout), format="rgb24")
            frame = frame.reformat(format="yuv420p")
        if self._key.is_set():
            self._key.clear()
            frame.pict_type = av.video.frame.PictureType.I
        packets = self._codec.encode(frame)
        unit = b"".join(bytes(p) for p in packets)
        return unit, any(p.is_keyframe for p in packets)


def _h264(size: tuple[int, int], rate: Fraction, preset: str):
    """An x264 encoder for WebRTC: constrained baseline, zero latency (one access unit out per frame in), headers in
    every key frame."""
    import av

    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height, codec.pix_fmt = size[0], size[1], "yuv420p"
    codec.time_base, codec.framerate = 1 / rate, rate
    gop = max(1, round(GOP_SECONDS * rate))
    codec.options = {"preset": preset, "tune": "zerolatency", "profile": "baseline",
                     "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:repeat-headers=1:annexb=1"}
    codec.open()
    return codec


class Outputs:
    """One session's frames to several outputs in turn (a file or network stream and the watchers' relay)."""

    def __init__(self, *outputs) -> None:
        self.outputs = outputs

    @property
    def frames_written(self) -> int:
        return self.outputs[0].frames_written

    @property
    def samples_written(self) -> int:
        return self.outputs[0].samples_written

    def alive(self) -> bool:
        return all(o.alive() for o in self.outputs)

    def write(self, frame: np.ndarray, audio: np.ndarray) -> None:
        for o in self.outputs:
            o.write(frame, audio)

    def close(self) -> None:
        errors = []
        for o in self.outputs:
            try:
                o.close()
            except BaseException as e:  # noqa: BLE001 - every output closed, the first failure raised
                errors.append(e)
        if errors:
            raise errors[0]

    def abort(self) -> None:
        for o in self.outputs:
            o.abort()
