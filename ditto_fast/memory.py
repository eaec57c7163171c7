"""Process memory policy for streaming many large frames."""

from __future__ import annotations

import ctypes


def serve_frames_from_mmap(threshold: int = 1 << 20) -> None:
    """Ask glibc to mmap every allocation above `threshold` bytes, so freed frame buffers go back to the OS.

    glibc raises its mmap threshold after the first large free and then serves multi-megabyte frames from
    the heap, where fragmentation makes a long job's memory creep upwards. No-op off glibc.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)   # -3 = M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass
