"""Audio decoded at a check, kept for the render: a job's check (jobs/accept.py) and an upload's (page/api.py) put
it, a job's render (jobs/dispatch.py) takes it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from ditto_fast.audio.decode import DecodedAudio
from ditto_fast.core.files import file_signature

MEMO_BYTES = 256 << 20                    # decoded audio kept between a job's check and its render


class DecodedMemo:
    """The audio a job's check decoded, kept (up to MEMO_BYTES, oldest dropped first) for its render, which then
    decodes nothing; taken back only if the file is the same one, unchanged, since."""

    def __init__(self, limit: int = MEMO_BYTES):
        self.limit = limit
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
