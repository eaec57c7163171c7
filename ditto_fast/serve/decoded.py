"""Audio decoded at a check, kept for the render: a job's check (jobs/accept.py) and an upload's (page/api.py) put
it, a job's render (jobs/dispatch.py) takes it; how long a job's audio may last (the decoding stops there); and how
many files the server decodes at once (`Decoders`), so that its memory is bounded however many requests come."""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ditto_fast.audio.decode import DecodedAudio, decode_audio
from ditto_fast.core.errors import UsageError
from ditto_fast.core.files import file_signature
from ditto_fast.core.memory import release_free_memory
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE

MAX_SPEECH_S = 3600.0           # the longest audio a served job takes: a whole programme's read; decoded (16 kHz
#                                 float32, 230 MB) it is what the memo keeps for its render. A file whose header says
#                                 more is refused before it is decoded, and one that says nothing when the decoding
#                                 gets there: the server never holds more of any file than this
MEMO_BYTES = 256 << 20                    # decoded audio kept between a job's check and its render
assert MAX_SPEECH_S * SPEECH_SAMPLE_RATE * 4 <= MEMO_BYTES
DECODES_AT_ONCE = 2             # files decoded at a time: each holds up to MAX_SPEECH_S of 16 kHz float32 (230 MB),
#                                 so the server's decoding never holds more than twice that, whatever comes
DECODE_LINE = 8                 # requests (an upload, a job over the API) that wait their turn beyond those; one
#                                 more is answered 503 with Retry-After at once (none of them holds an HTTP worker
#                                 thread long, nor all of them)
DECODE_WAIT_S = 120.0           # the longest one of those waits (then 503 with Retry-After as well)
RETRY_AFTER_S = 10              # what the 503 asks a client to wait before it sends the request again


class DecodersBusy(UsageError):
    """Every decoder of this server is taken and its line full (or the wait too long): send the request again later
    (HTTP 503 with Retry-After)."""

    retry_after = RETRY_AFTER_S


class Decoders:
    """At most `at_once` decodings at a time in this process; a request waits its turn in a line of at most `line`
    (DecodersBusy beyond it, or after `wait_s`); a patient caller (a render about to start, the watch folder: a
    thread each, never many) waits as long as it takes. After each decoding the heap's free pages go back to the
    system (its chunks freed in a worker thread's arena stay there otherwise)."""

    def __init__(self, at_once: int = DECODES_AT_ONCE, line: int = DECODE_LINE, wait_s: float = DECODE_WAIT_S):
        self.at_once, self.line, self.wait_s = at_once, line, wait_s
        self._slots = threading.BoundedSemaphore(at_once)
        self._lock = threading.Lock()
        self.running = self.waiting = 0

    @contextmanager
    def turn(self, patient: bool = False) -> Iterator[None]:
        """Hold one decoder while the block runs; DecodersBusy when none is free and the line is full (or it stays
        taken past `wait_s`), unless `patient`."""
        if not self._slots.acquire(blocking=False):
            with self._lock:
                if not patient and self.waiting >= self.line:
                    raise self._busy(f"{self.waiting} more wait in line")
                self.waiting += 1
            try:
                got = self._slots.acquire(timeout=None if patient else self.wait_s)
            finally:
                with self._lock:
                    self.waiting -= 1
            if not got:
                raise self._busy(f"none came free in {self.wait_s:g} s")
        with self._lock:
            self.running += 1
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1
            self._slots.release()
            release_free_memory()

    def _busy(self, why: str) -> DecodersBusy:
        return DecodersBusy(f"this server decodes {self.at_once} audio files at a time and all are taken ({why}); "
                            f"send the request again in {RETRY_AFTER_S} s")


class DecodedMemo:
    """The audio a job's check decoded, kept (up to MEMO_BYTES, oldest dropped first) for its render, which then
    decodes nothing; taken back only if the file is the same one, unchanged, since."""

    def __init__(self, limit: int = MEMO_BYTES, longest: float = MAX_SPEECH_S, decoders: Decoders | None = None):
        """`limit`: the bytes kept; `longest`: the seconds a job's audio may last (its checks decode no more);
        `decoders`: the server's decoders (default: its own)."""
        self.limit, self.longest = limit, longest
        self.decoders = decoders or Decoders()
        self._kept: OrderedDict[str, tuple[tuple[int, int, int], DecodedAudio]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, path: Path, audio: DecodedAudio) -> None:
        signature = file_signature(path)
        if signature is None or audio.samples.nbytes > self.limit:
            return
        with self._lock:
            self._kept[str(path)] = (signature, audio)
            self._kept.move_to_end(str(path))
            while sum(a.samples.nbytes for _, a in self._kept.values()) > self.limit:
                self._kept.popitem(last=False)

    def take(self, path: Path) -> DecodedAudio | None:
        """The audio decoded from `path` if it is unchanged since; None otherwise (decode it again)."""
        with self._lock:
            kept = self._kept.get(str(path))
        if kept is None or kept[0] != file_signature(path):
            return None
        return kept[1]

    def decode(self, path: Path, max_seconds: float | None = None, patient: bool = False) -> DecodedAudio:
        """`path` decoded in one of the server's decoders (see Decoders; DecodersBusy unless `patient`), at most
        `max_seconds` (default: `longest`) of it."""
        with self.decoders.turn(patient):
            return decode_audio(path, self.longest if max_seconds is None else min(max_seconds, self.longest))

    def patient(self, path: Path, max_seconds: float | None = None) -> DecodedAudio:
        """decode() for a caller that waits its turn however long it takes (check_clip's `decode`)."""
        return self.decode(path, max_seconds, patient=True)
