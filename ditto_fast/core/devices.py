"""Device choice (never assume CUDA) and numpy's BLAS threads; precision is chosen in engine/precision.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ditto_fast.core.errors import UsageError



def resolve_device(device: str = "auto") -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a usage error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here; use --device cpu or auto")
    return torch.device(device)


@contextmanager
def numpy_blas_single_threaded() -> Iterator[None]:
    """numpy's BLAS (OpenBLAS) on one thread for the duration; torch's own thread pool is not touched.

    Our numpy matrix work is tiny (landmarks, 3x3 transforms), but after each call OpenBLAS's idle
    workers spin-yield and take a core from torch, mediapipe and ffmpeg.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
