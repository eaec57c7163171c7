"""Audio decoded at a check, kept for the render: a job's check (jobs/accept.py) and an upload's (page/api.py) put
it, a job's render (jobs/dispatch.py) takes it; and how long a job's audio may last (the decoding stops there)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from ditto_fast.audio.decode import DecodedAudio
from ditto_fast.core.files import file_signature
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE

MAX_SPEECH_S = 3600.0           # the longest audio a served job takes: a whole programme's read; decoded (16 kHz
#                                 float32, 230 MB) it is what the memo keeps for its render. A file whose header says
#                                 more is refused before it is decoded, and one that says nothing when the decoding
#                                 gets there: the server never holds more of any file than this
MEMO_BYTES = 256 << 20                    # decoded audio kept between a job's check and its render
assert MAX_SPEECH_S * SPEECH_SAMPLE_RATE * 4 <= MEMO_BYTES


class DecodedMemo:
    """The audio a job's check decoded, kept (up to MEMO_BYTES, oldest dropped first) for its render, which then
    decodes nothing; taken back only if the file is the same one, unchanged, since."""

    def __init__(self, limit: int = MEMO_BYTES, longest: float = MAX_SPEECH_S):
        """`limit`: the bytes kept; `longest`: the seconds a job's audio may last (its checks decode no more)."""
        self.limit, self.longest = limit, longest
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
