"""What a live session measures: latency from speech in to picture out, each stage's share of real time, and the
frames that left late, repeated or not at all."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from fractions import Fraction
from typing import Callable

import numpy as np

from ditto_fast.media.rates import MOTION_FPS, SPEECH_SAMPLE_RATE

STAGES = ("audio_features", "motion", "stitch", "render", "handoff", "putback", "write")
MADE = ("stitch", "render", "handoff", "putback")    # stages of the frames made (write: of every frame sent)
BEHIND_EVERY_S = 5.0        # at most one "behind" line in the log this often
LATENCIES_KEPT = 20_000     # a uniform sample of the stream's latencies (about 50 a second arrive): bounded memory


class Reservoir:
    """A uniform random sample of at most `size` values of a stream of any length (Vitter's algorithm R, a fixed
    seed), and the exact maximum: a day-long stream's latency quantiles in bounded memory."""

    def __init__(self, size: int = LATENCIES_KEPT):
        self.size, self.seen, self.values, self.max = size, 0, [], None
        self._rng = random.Random(0)

    def add(self, value: float) -> None:
        self.seen += 1
        self.max = value if self.max is None else max(self.max, value)
        if len(self.values) < self.size:
            self.values.append(value)
        else:
            j = self._rng.randrange(self.seen)
            if j < self.size:
                self.values[j] = value


class SkippedSlots:
    """Slot numbers given up on, as increasing runs [first, end), counted among the slots sent so far: the frames
    thread may give up on slots the stream never sends (it stopped first). Runs wholly sent are folded into a count
    (bounded memory for a day-long stream); safe between the thread adding runs and the one reading the count."""

    def __init__(self) -> None:
        self._done = 0                  # slots of the runs folded, all sent
        self._runs: deque[tuple[int, int]] = deque()
        self._lock = threading.Lock()

    def add(self, first: int, end: int, sent: int) -> None:
        """Slots [first, end) given up on, `sent` slots being out now."""
        with self._lock:
            if end > first:
                self._runs.append((first, end))
            self._fold(sent)

    def among(self, sent: int) -> int:
        """How many of slots [0, sent) were given up on."""
        with self._lock:
            self._fold(sent)
            return self._done + sum(max(0, min(end, sent) - first) for first, end in self._runs)

    def _fold(self, sent: int) -> None:
        while self._runs and self._runs[0][1] <= sent:
            first, end = self._runs.popleft()
            self._done += end - first


CUSHION_FRAMES = 2          # the least the clock waits after the first frame is ready, in frames


def speech_floor(window_frames: int, jitter: float) -> dict[str, float]:
    """What the first frame waits for before any compute, in seconds: the jitter allowance, the speech rows of the
    first two windows (HuBERT gives them in lumps of five, 0.2 s) and HuBERT's look-ahead."""
    from ditto_fast.audio.stream_features import CHUNK_HOP, CHUNK_LOOKAHEAD

    lump = CHUNK_HOP / SPEECH_SAMPLE_RATE
    return {"jitter": jitter, "speech_rows": -(-2 * window_frames // 5) * lump,
            "look_ahead": CHUNK_LOOKAHEAD / SPEECH_SAMPLE_RATE}


def clock_cushion(window_frames: int, compute: float) -> float:
    """Seconds the clock starts after the first frame is ready, `compute` the seconds that frame took past the speech
    floor: two frames, and that compute again. The window loop hands out frames a window at a time, but each lump's
    speech comes a window after the one before, so a lump is ready as its first slot comes if its window computes no
    slower than the first did (which carries the warm-up); the compute again is room for one up to twice as slow.
    Never more than a window and two frames (what the clock waited before: the lump taken for a delay)."""
    return min((window_frames + CUSHION_FRAMES) / MOTION_FPS, CUSHION_FRAMES / MOTION_FPS + max(0.0, compute))


class LiveStats:
    """Counters and latencies of one session; `summary()` is the --stats JSON."""

    def __init__(self, rate: Fraction):
        self.rate = rate
        self.seconds = {k: 0.0 for k in STAGES}
        self.slots = 0              # frames sent
        self.rendered = 0           # frames made (stitch + warp + decode)
        self.sent = 0               # of the slots, frames sent as made for them
        self.held = 0               # slots sent before any frame was made: the plate as shot
        self.repeated = 0           # slots whose frame was not ready: the last one again
        self._skips = SkippedSlots()   # slots whose frame was not made: it would have missed its slot
        self.late = 0               # frames made that came after their slot had gone
        self.motion_skipped = 0.0   # seconds of speech whose motion was dropped to catch up with the clock
        self.source_error: str | None = None
        self.latencies = Reservoir()
        self.first_frame: float | None = None
        self.latency_budget: dict | None = None     # the stream's delay in its parts, ms (budget())
        self.audio = None           # the session's StreamAudio, once it runs
        self._behind_at, self._behind_from = 0.0, 0

    def skip(self, first: int, end: int) -> None:
        """Slots [first, end) get no frame of their own (it would have missed its slot): counted once they are sent."""
        self._skips.add(first, end, self.slots)

    @property
    def skipped(self) -> int:
        """Of the slots sent, those whose frame was not made (each went out repeated or held): never more than the
        frames sent, however far ahead of the output the frames thread gave up on slots."""
        return self._skips.among(self.slots)

    def latency(self, sent: float, arrivals: list[float], first_speech: tuple[int, float] | None,
                samples: tuple[int, int]) -> None:
        """An output frame, made for its slot, left at `sent` carrying the motion of stream samples [a, b): the speech
        that arrived in them, and the first speech of the stream once a frame at or after it leaves.

        What is counted is what a viewer sees: from the moment a piece of speech was there to be spoken (it arrived,
        or, where it came ahead of its turn, as a TTS writing a whole answer at once makes it, its turn on the
        stream's clock came) to its frame leaving. Speech waiting for its turn is no delay of the picture's."""
        for t in arrivals:
            self.latencies.add(sent - max(t, self.turn(samples[0])))
        if self.first_frame is None and first_speech is not None and samples[1] > first_speech[0]:
            self.first_frame = sent - max(first_speech[1], self.turn(first_speech[0]))

    def turn(self, position: int) -> float:
        """When stream sample `position` had its turn on the stream's clock (time.monotonic(); before any time when
        the stream's audio is not known)."""
        return self.audio.start + position / SPEECH_SAMPLE_RATE if self.audio is not None else float("-inf")

    def note_behind(self, log: Callable[[str], None]) -> None:
        """Say in the log, at most every BEHIND_EVERY_S, that frames are being repeated."""
        now = time.monotonic()
        if now - self._behind_at >= BEHIND_EVERY_S:
            log(f"live: rendering is behind the clock: {self.repeated - self._behind_from} frame(s) repeated and "
                f"{self.skipped} skipped so far; the stream keeps its rate and its audio")
            self._behind_at, self._behind_from = now, self.repeated

    def budget(self, delay: float, window_frames: int, jitter: float, cushion: float) -> None:
        """The stream's delay (its clock's start after the session's: what speech sent at its pace waits to be seen)
        in its parts: the speech floor (speech_floor()), the clock's cushion after the first frame (clock_cushion()),
        the floor (all of it with no compute: a cushion of two frames) and the rest: the compute of the first
        windows and frame, and the part of the cushion sized from it."""
        parts = speech_floor(window_frames, jitter)
        parts["cushion"] = cushion
        parts["floor"] = sum(parts.values()) - cushion + CUSHION_FRAMES / MOTION_FPS
        parts["compute"] = max(0.0, delay - parts["floor"])
        parts["delay"] = delay
        self.latency_budget = {k: round(1000 * v, 1) for k, v in parts.items()}

    def summary(self, ended_by: str | None = None) -> dict:
        """The figures as JSON-ready values: latencies in seconds, each stage's real-time factor (its seconds per
        second of stream), the frame counts; `ended_by`: what ended the stream (None while it streams)."""
        stream_s = self.slots / float(self.rate) if self.slots else 0.0
        lat = np.array(self.latencies.values) if self.latencies.values else None
        audio = self.audio
        return {
            "stream_seconds": round(stream_s, 3),
            "speech_seconds": round(audio.speech / SPEECH_SAMPLE_RATE, 3) if audio else 0.0,
            "first_frame_latency_s": None if self.first_frame is None else round(self.first_frame, 4),
            "latency_budget_ms": self.latency_budget,
            "latency_s": None if lat is None else {"median": round(float(np.median(lat)), 4),
                                                   "p95": round(float(np.percentile(lat, 95)), 4),
                                                   "max": round(float(self.latencies.max), 4)},
            "rtf": self.rtf(stream_s),
            "ms_per_frame": {k: round(1000 * v / max(1, self.rendered if k in MADE else self.slots), 2)
                             for k, v in self.seconds.items() if k not in ("audio_features", "motion")},
            "frames": {"sent": self.slots, "rendered": self.rendered, "on_time": self.sent, "held": self.held,
                       "repeated": self.repeated, "skipped": self.skipped, "late": self.late},
            "motion_skipped_s": round(self.motion_skipped, 3),
            # speech that came later than its cushion allowed (a hole of silence each), and the cushion it has now
            "speech_late": getattr(audio, "late", 0), "speech_cushion_s": round(getattr(audio, "hold", 0.0), 3),
            "source_error": self.source_error,
            "ended_by": ended_by,
        }

    def rtf(self, stream_s: float) -> dict:
        """Each stage's seconds per second of stream, as if it had made every frame: the motion stages per second of
        audio they took in, the frame stages per frame made (or sent) times the rate."""
        fps = float(self.rate)
        decided = getattr(self.audio, "length", 0) / SPEECH_SAMPLE_RATE or stream_s    # the audio decided: ahead of frames
        audio_s = max(1e-9, decided - self.motion_skipped)
        out = {k: round(self.seconds[k] / audio_s, 4) if stream_s else None for k in ("audio_features", "motion")}
        for k in ("stitch", "render", "handoff", "putback", "write"):
            n = self.rendered if k in MADE else self.slots
            out[k] = round(self.seconds[k] / n * fps, 4) if n else None
        return out

    @staticmethod
    def line(summary: dict) -> str:
        """The one line the command prints at the end: the frames sent as on time, repeated and held (which add up
        to them), and how many of those repeated or held had no frame made for them (skipped)."""
        f, lat = summary["frames"], summary["latency_s"]
        ffl = summary["first_frame_latency_s"]
        return (f"live: {summary['stream_seconds']:.1f} s streamed ({summary['speech_seconds']:.1f} s of speech), "
                f"{f['sent']} frames: {f['on_time']} on time, {f['repeated']} repeated, {f['held']} held"
                + (f" ({f['skipped']} of these skipped: not rendered, to keep the clock)" if f["skipped"] else "")
                + "; first frame "
                + (f"{ffl * 1000:.0f} ms" if ffl is not None else "n/a")
                + (f", latency median {lat['median'] * 1000:.0f} ms p95 {lat['p95'] * 1000:.0f} ms" if lat else ""))
