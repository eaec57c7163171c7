"""torch's intra-op thread count is one setting for the whole process: live sessions that run beside each other on
one engine lower it together (`sessions_threads`) and the last to end gives it back, whatever order they end in."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_users = 0
_before: int | None = None


@contextmanager
def sessions_threads(count: int) -> Iterator[None]:
    """torch on `count` threads while any session holds this; the count from before the first, after the last."""
    global _users, _before
    import torch

    with _lock:
        if _users == 0:
            _before = torch.get_num_threads()
            torch.set_num_threads(count)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _before is not None:
                torch.set_num_threads(_before)
