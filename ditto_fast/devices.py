"""Device and precision choice: never assume CUDA; fp16 on CUDA, fp32 on CPU unless asked."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .errors import UsageError

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a usage error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here; use --device cpu or auto")
    return torch.device(device)


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """'auto' -> float16 on CUDA, float32 on CPU (renders ask render/precision.py there); fp16 on CPU is
    refused (slow and lossy there)."""
    if precision == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision}: use auto, fp16, bf16 or fp32")
    if precision == "fp16" and device.type == "cpu":
        raise UsageError("--precision fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise UsageError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 arithmetic (it came "
                         "with Ampere); use fp16 or auto")
    return PRECISIONS[precision]


@contextmanager
def numpy_blas_single_threaded() -> Iterator[None]:
    """numpy's BLAS (OpenBLAS) on one thread for the duration; torch's own thread pool is not touched.

    Our numpy matrix work is tiny (landmarks, 3x3 transforms), but after each call OpenBLAS's idle
    workers spin-yield and take a core from torch, mediapipe and ffmpeg.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
