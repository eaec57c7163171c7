"""A live session: speech arriving -> motion -> frames -> one stream out, on the wall clock, never stalling.

Three threads, each a stage of the offline render called as the stream goes:
  motion   the stream's audio decided on the wall clock (stream_audio.py: the source's samples, silence where none
           came), HuBERT per chunk and Ditto's online window loop (motion.py): motion frames by stream position
  frames   (the caller's thread) each output frame's keypoints (stitch) and its warp + decode: crops
  output   the frame clock: slot i leaves at T0 + i / rate with the stream's audio of that slot; a crop that came
           in time is pasted into its plate frame (putback) and sent, else the last frame is sent again (counted)

The clock starts when the first frame is ready plus a cushion of two frames and that frame's compute again (the
window loop hands out frames a window at a time, each lump a window of speech after the last: stats.clock_cushion),
and never later than --max-latency after the session began: so the delay
from speech in to picture out is fixed for the whole stream and at most --max-latency. Falling behind never
delays the stream: a frame that would miss its slot is not rendered (the last one is shown again, its audio goes
out), and motion that fell more than the delay behind skips ahead to the present.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from ditto_fast.avatar import Avatar
from ditto_fast.avatar.plate import PlateReader
from ditto_fast.core.errors import Terminated
from ditto_fast.audio.stream_features import CHUNK_HOP
from ditto_fast.core.threads import sessions_threads
from ditto_fast.live.motion import LiveMotion
from ditto_fast.live.stats import LiveStats, clock_cushion, speech_floor
from ditto_fast.live.stream_audio import StreamAudio
from ditto_fast.media.rates import MOTION_FPS
from ditto_fast.audio.decode import SAMPLES_PER_FRAME, frame_count
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE, frames_for
from ditto_fast.media.timeline import mirror_index, mirror_positions, motion_positions, source_positions
from ditto_fast.motion.controls import Controls
from ditto_fast.motion.keypoints import motion_to_info
from ditto_fast.motion.stitch import MotionStitch
from ditto_fast.render.putback import YuvPutback

PLATE_HORIZON_S = 3600      # the plate reader is told an hour of frames ahead, then reopened
POLL_S = 0.02               # how often the motion thread looks at the clock


@dataclass(frozen=True)
class LiveSettings:
    """What a session renders with: the request's live settings, resolved."""

    emotion: np.ndarray                 # [8]
    seed: int
    steps: int
    codec: str                          # h264 or hevc
    overlap: int                        # the online loop's window overlap (new frames per window: 80 - overlap)
    rate: Fraction                      # output frames per second
    blend: str
    controls: Controls | None
    max_latency: float                  # seconds: the most the stream may lag its speech
    stop_at_end: bool


class LiveSession:
    """One live stream: `run()` blocks until the source ends (--stop-at-end), `stop()` is called, or an interrupt
    (Ctrl-C, SIGTERM) arrives; the output is then closed cleanly and the stats returned."""

    def __init__(self, renderer, avatar: Avatar, source, output, settings: LiveSettings,
                 log: Callable[[str], None] | None = None, fused=None, windows=None):
        """`fused`: the warp + decode to call (an engine's sessions on a GPU share one, render/shared_fused.py);
        by default the renderer's, with buffers of the session's own. `windows(steps)`: the LMDM window sampler to
        call (shared on a GPU: motion/shared_windows.py); by default the session's own."""
        self.renderer, self.avatar, self.source, self.output, self.s = renderer, avatar, source, output, settings
        self.log = log or (lambda line: None)
        self.stats = LiveStats(settings.rate)
        self._stop = threading.Event()
        self.ended_by: str | None = None                      # why stop() was called, once it was
        self._motion: dict[int, np.ndarray] = {}              # motion index -> [265]
        self._motion_cv = threading.Condition()
        self._motion_low = 0                                  # motion indices below it will never come
        self._motion_end: int | None = None                   # one past the last motion index, once the stream ended
        self._end_slot: int | None = None                     # one past the last output frame, once known
        self.window_frames = renderer.lmdm.seq_len - settings.overlap     # new motion frames per LMDM window
        self._crops: queue.Queue = queue.Queue(maxsize=max(4, 2 * self.window_frames))
        self._t0: float | None = None                         # wall time of slot 0
        self._errors: list[BaseException] = []
        self.render_estimate = 0.0                            # seconds a frame's stitch + warp + decode takes
        self.fused = fused or renderer.fused.twin()           # its own buffers: an engine may render beside it
        self.windows = windows
        self._sent = (-1, 0)            # the last frame gone out, and the stream samples (16 kHz) gone out with it

    # -- the clock ---------------------------------------------------------------------------------------------
    def slot_time(self, i: int) -> float:
        """Wall time output frame i leaves at (the clock must have started)."""
        return self._t0 + float(i / self.s.rate)

    @property
    def played(self) -> tuple[int, int]:
        """How far into the source the stream has gone out, and with which frame: (the source index after the last
        sample sent, the index of the frame it went with; -1 before the first)."""
        frame, samples = self._sent
        audio = self.stats.audio
        return (audio.source_index(samples) if audio is not None else 0), frame

    @property
    def unsent(self) -> int:
        """Stream samples (16 kHz) of speech the stream has taken and not yet sent: what it still has to say."""
        audio = self.stats.audio
        return max(0, audio.speech_end - self._sent[1]) if audio is not None else 0

    def interrupt(self) -> int:
        """A listener interrupts: the speech not yet taken is dropped (the source's clear()), what was taken and not
        yet sent goes out silent; the face idles again within the stream's delay. Returns the samples dropped."""
        dropped = self.source.clear()
        if self.stats.audio is not None:
            self.stats.audio.silence(self._sent[1])
        return dropped

    def stop(self, why: str = "stop") -> None:
        """End the stream at the next frame (the output is closed cleanly by `run`); `why` is what the figures'
        `ended_by` says (the first reason given)."""
        if not self._stop.is_set():
            self.ended_by = self.ended_by or why
        self._halt()

    def _halt(self) -> None:
        self._stop.set()
        with self._motion_cv:
            self._motion_cv.notify_all()

    # -- motion thread -----------------------------------------------------------------------------------------
    def _motion_loop(self, motion: LiveMotion, audio: StreamAudio) -> None:
        fed = 0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                audio.advance(now, end_with_source=self.s.stop_at_end)
                closed = audio.closed_at                         # read first: nothing is decided after it
                new = audio.samples(fed, audio.length)           # the output may have decided some (a busy host)
                lag = len(new) / SPEECH_SAMPLE_RATE
                allowed = (self._t0 - self.start if self._t0 is not None else self.s.max_latency) - audio.jitter
                if lag > max(allowed, 2 * CHUNK_HOP / SPEECH_SAMPLE_RATE) and closed is None:
                    end = fed + len(new)                             # on from the last whole chunk before the end
                    start = (end - CHUNK_HOP) // CHUNK_HOP * CHUNK_HOP
                    motion.skip_to(start)
                    self.stats.motion_skipped += (start - fed) / SPEECH_SAMPLE_RATE
                    self.log(f"live: motion fell {lag:.1f} s behind the clock; skipped {(start - fed) / SPEECH_SAMPLE_RATE:.1f} s "
                             "of it")
                    new, fed = new[start - fed:], start
                    with self._motion_cv:
                        self._motion_low = max(self._motion_low, start // SAMPLES_PER_FRAME)
                fed += len(new)
                if len(new):
                    self._publish(motion.feed(new))
                if closed is not None:
                    self._publish(motion.finish())
                    with self._motion_cv:
                        self._motion_end = frame_count(audio.closed_at)
                        self._end_slot = max(1, frames_for(audio.closed_at, self.s.rate))
                        self._motion_cv.notify_all()
                    return
                if self.source.error and not self.stats.source_error:
                    self.stats.source_error = self.source.error
                    self.log(f"live: {self.source.error}; going on with silence")
                time.sleep(max(0.0, POLL_S - (time.monotonic() - now)))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, which raises it
            self._errors.append(e)
            self._halt()

    def _publish(self, frames: list[tuple[int, np.ndarray]]) -> None:
        if not frames:
            return
        with self._motion_cv:
            for j, m in frames:
                self._motion[j] = m
            self._motion_cv.notify_all()

    def _motion_for(self, i: int) -> tuple[np.ndarray, np.ndarray, float] | None:
        """The two motion frames around output frame i's time and the weight of the second, waiting for them; None
        when they will never come (skipped, or past the stream's end) or the session stops."""
        at, past = motion_positions(i, self.s.rate)
        j0, w = int(at), float(past)
        with self._motion_cv:
            while not self._stop.is_set():
                end = self._motion_end
                j1 = j0 + 1 if w > 0 else j0
                if end is not None:
                    j0, j1 = min(j0, end - 1), min(j1, end - 1)
                if j0 in self._motion and j1 in self._motion:
                    for k in [k for k in self._motion if k < j0 - 1]:
                        del self._motion[k]
                    return self._motion[j0], self._motion[j1], (w if j1 != j0 else 0.0)
                if end is not None and end <= 0 or j0 < self._motion_low or end is not None and j0 not in self._motion:
                    return None
                self._motion_cv.wait(0.1)
        return None

    # -- frames (the caller's thread) --------------------------------------------------------------------------
    def _frames_loop(self, motion: LiveMotion) -> None:
        r, avatar = self.renderer, self.avatar
        stitch = MotionStitch(r.stitch_net, is_image=avatar.is_image, controls=self.s.controls)
        timer = self.stats.seconds
        i = 0
        while not self._stop.is_set():
            if self._end_slot is not None and i >= self._end_slot:
                break
            if self._t0 is not None:                    # a frame that would miss its slot is not made
                late = int((time.monotonic() + self.render_estimate - self._t0) * self.s.rate) + 1
                if late > i:
                    self.stats.skip(i, late)
                    i = late
                    continue
            got = self._motion_for(i)
            if got is None:
                if self._end_slot is None and not self._stop.is_set():
                    self.stats.skip(i, i + 1)
                i += 1
                continue
            m0, m1, w = got
            t0 = time.perf_counter()
            if stitch.d0 is None and motion.d0 is not None:      # relative to the loop's first frame, as Ditto's
                stitch.d0 = {k: np.asarray(v[:1], np.float32).copy() for k, v in motion_to_info(motion.d0).items()}
            src = self._source_frame(i)
            stitch.frame = i
            x_s, x_d = stitch.batch(avatar.frame_infos(np.array([src])), motion_to_info(m0[None]),
                                    motion_to_info(m1[None]), np.array([w]))
            t1 = time.perf_counter()
            crop = self.fused(avatar.features(np.array([src])), x_s, x_d)[0]
            t2 = time.perf_counter()
            timer["stitch"] += t1 - t0
            timer["render"] += t2 - t1
            self.render_estimate = 0.8 * self.render_estimate + 0.2 * (t2 - t0) if self.stats.rendered else t2 - t0
            self.stats.rendered += 1
            while not self._stop.is_set():
                try:
                    self._crops.put((i, crop, x_s[0], x_d[0], src), timeout=0.1)
                    break
                except queue.Full:
                    continue
            timer["handoff"] += time.perf_counter() - t2
            i += 1
        if not self._crops.full():                  # the output stops waiting for crops (it ends at its last slot)
            self._crops.put(None)

    def _source_frame(self, i: int) -> int:
        """The plate frame output frame i shows (the source's own time, mirror-looped)."""
        return mirror_index(int(source_positions(i, self.s.rate, self.avatar.rate)), self.avatar.n_frames)

    # -- output thread -----------------------------------------------------------------------------------------
    def _plate(self, first: int) -> PlateReader:
        a = self.avatar
        frames = np.arange(first, first + int(PLATE_HORIZON_S * self.s.rate))
        order = mirror_positions(source_positions(frames, self.s.rate, a.rate), a.n_frames)
        return PlateReader(a.plate_source, a.n_frames, is_image=a.is_image, pix_fmt="planes", order=order)

    def _output_loop(self, audio: StreamAudio) -> None:
        try:
            self._send_frames(audio)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self._errors.append(e)
            self._halt()

    def _send_frames(self, audio: StreamAudio) -> None:
        a, st, timer = self.avatar, self.stats, self.stats.seconds
        plate = self._plate(0)
        plate_until = int(PLATE_HORIZON_S * self.s.rate)
        putback = YuvPutback(layout=plate.layout, blend=self.s.blend)
        ready: dict[int, np.ndarray] = {}
        last, prev_src, heading = None, None, 0
        first = self._wait_first()
        if first is None:
            return
        floor = sum(speech_floor(self.window_frames, audio.jitter).values())
        cushion = clock_cushion(self.window_frames, first - self.start - floor)
        self._t0 = min(first + cushion, self.start + self.s.max_latency)
        self.stats.budget(self._t0 - self.start, self.window_frames, audio.jitter, cushion)
        i, ended = 0, False
        try:
            while not self._stop.is_set():
                if self._end_slot is not None and i >= self._end_slot:
                    break
                due = self.slot_time(i)
                while not ended:                            # paste what comes until this slot is due
                    wait = due - time.monotonic()
                    try:
                        item = self._crops.get(timeout=max(wait, 0.0)) if wait > 0 else self._crops.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        ended = True
                        break
                    k, crop, x_s, x_d, src = item
                    if k < i:
                        st.late += 1
                        continue
                    if k >= plate_until:                        # the next hour's plate reader
                        plate.close()
                        plate, plate_until = self._plate(k), k + int(PLATE_HORIZON_S * self.s.rate)
                    t0 = time.perf_counter()
                    step = src - prev_src if prev_src is not None else 0
                    cut = abs(step) > 1 or step * heading < 0
                    heading = int(np.sign(step)) or heading
                    prev_src = src
                    ready[k] = putback(plate.frame(src), crop, a.M_c2o[src], x_s, x_d, cut)
                    timer["putback"] += time.perf_counter() - t0
                frame = ready.pop(i, None)
                if frame is not None:
                    last = frame
                    st.sent += 1
                elif last is None:                          # nothing rendered yet: the plate as shot
                    last = plate.frame(self._source_frame(i))
                    st.held += 1
                else:
                    st.repeated += 1
                    st.note_behind(self.log)
                for k in [k for k in ready if k < i]:
                    del ready[k]
                samples = self._slot_samples(i)
                audio.advance(time.monotonic(), end_with_source=self.s.stop_at_end)   # its audio decided, however
                t0 = time.perf_counter()                                               # late the motion thread is
                self.output.write(last, audio.pcm(*samples))
                self._sent = (i, samples[1])
                sent = time.monotonic()
                timer["write"] += time.perf_counter() - t0
                if frame is not None:
                    st.latency(sent, audio.arrived_in(*samples), audio.first_speech, samples)
                st.slots = i + 1
                i += 1
        finally:
            plate.close()

    def _slot_samples(self, i: int) -> tuple[int, int]:
        """Stream samples [a, b) that go out with output frame i."""
        num, den = SPEECH_SAMPLE_RATE * self.s.rate.denominator, self.s.rate.numerator
        return i * num // den, (i + 1) * num // den

    def _wait_first(self) -> float | None:
        """Wall time the first crop was ready (put back in the queue), or the latest start the delay allows."""
        deadline = self.start + self.s.max_latency
        while not self._stop.is_set():
            if not self._crops.empty():
                return time.monotonic()
            if time.monotonic() >= deadline:
                self.log(f"live: no frame within --max-latency {self.s.max_latency:g} s; starting with the plate")
                return deadline
            time.sleep(0.005)
        return None

    # -- the whole -----------------------------------------------------------------------------------------------
    def run(self) -> dict:
        """Stream until the end, `stop()` or an interrupt; close the output cleanly; return the stats."""
        if self.renderer.device.type != "cpu":
            return self._run()
        # two threads of networks (motion, frames): one core each, not both on both; the engine's renders after the
        # last session run as before the first
        with sessions_threads(max(1, (os.cpu_count() or 2) // 2)):
            return self._run()

    def _run(self) -> dict:
        r = self.renderer
        motion = LiveMotion(r.hubert, r.lmdm, r.config.motion, self.avatar, self.s.emotion, self.s.seed, self.s.steps,
                            self.s.overlap, r.device, r.denoise,
                            sample_window=self.windows(self.s.steps) if self.windows else None)
        self.start = time.monotonic()
        self.source.start()
        audio = StreamAudio(self.source, self.start)
        self.stats.audio = audio
        threads = [threading.Thread(target=self._motion_loop, args=(motion, audio), name="live-motion", daemon=True),
                   threading.Thread(target=self._output_loop, args=(audio,), name="live-output", daemon=True)]
        for t in threads:
            t.start()
        interrupted = None
        try:
            self._frames_loop(motion)
            threads[1].join()           # the output sends every slot up to the end (or stops with the session)
        except (KeyboardInterrupt, Terminated) as e:
            interrupted = e
        finally:
            self._halt()
            for t in threads:
                t.join(timeout=10)
            self.source.close()
            self.stats.seconds.update(motion.seconds)
            if self._errors:
                self.output.abort()
            else:
                self.output.close()
        if self._errors:
            raise self._errors[0]
        return self.stats.summary("interrupt" if interrupted is not None else self.ended_by or "end of source")
