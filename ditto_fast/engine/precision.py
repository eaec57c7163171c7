"""The render's precision, decided here alone: `--precision`, and `auto`: fp16 on CUDA; on a CPU, a rule of what the
CPU is (`cpu_rule`), never a timing, so two stores, two runs or two machines of one kind choose alike.

The rule: bf16 where the CPU's flags say it does bf16 arithmetic (AMX-BF16 or AVX512-BF16), else fp32 (elsewhere
bf16 is emulated and slower). `benchmark.py precision` times both per CPU kind and says whether the rule's choice is
the faster one. $DITTO_FAST_CPU_PRECISION (fp32 or bf16) pins the choice instead, for a farm of mixed CPU kinds.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from ditto_fast.core.config import PRECISIONS
from ditto_fast.core.errors import UsageError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}   # each of PRECISIONS but auto
# pins what auto picks on every CPU (one precision, so the same bytes, on a farm of mixed CPU kinds)
PIN_ENV = "DITTO_FAST_CPU_PRECISION"
# a CPU with either does bf16 arithmetic natively (AMX tiles, or AVX-512's bf16 dot products): bf16 there
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
KIND_FLAGS = ("avx2", "avx512f", *BF16_FLAGS, "amx_tile")     # the flags that tell CPU kinds apart for us


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> frozenset[str]:
    """The ISA flags of this machine's first CPU as Linux lists them (empty where there is no such file)."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_kind() -> dict:
    """The CPU's model name and the flags that tell kinds apart (what benchmarks and the batch probe key on)."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("unknown", "x86_64", ""):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"model": model, "flags": sorted(f for f in cpu_flags() if f in KIND_FLAGS)}


def cpu_rule(flags: Iterable[str]) -> tuple[str, str]:
    """(precision, why) `auto` picks on a CPU with these ISA flags: bf16 if any of BF16_FLAGS, else fp32."""
    native = [f for f in BF16_FLAGS if f in set(flags)]
    if native:
        return "bf16", f"bf16: cpu flags: {', '.join(native)}"
    return "fp32", f"fp32: cpu flags: no {' or '.join(BF16_FLAGS)} (bf16 would be emulated)"


def cpu_precision() -> tuple[torch.dtype, str]:
    """(dtype, why) for `--precision auto` on this CPU: the pin if set, else `cpu_rule` of this CPU's flags."""
    pinned = os.environ.get(PIN_ENV, "")
    if pinned:
        if pinned not in ("fp32", "bf16"):
            raise UsageError(f"{PIN_ENV}={pinned}: use fp32 or bf16 (or unset it to let each CPU choose)")
        return DTYPES[pinned], f"{pinned}: pinned by {PIN_ENV}"
    name, why = cpu_rule(cpu_flags())
    return DTYPES[name], why


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB between two uint8 images (inf when equal): how the benchmarks compare precisions."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)


def choose_precision(precision: str, device: torch.device) -> tuple[torch.dtype, str]:
    """(dtype, why) for `--precision`: 'auto' -> float16 on CUDA, on a CPU `cpu_precision`; fp16 on a CPU (slow and
    lossy there) and bf16 on a GPU without it are refused."""
    if precision == "auto":
        return (torch.float16, "fp16: on CUDA") if device.type == "cuda" else cpu_precision()
    if precision not in DTYPES:
        raise UsageError(f"--precision {precision}: use {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}")
    if precision == "fp16" and device.type == "cpu":
        raise UsageError("--precision fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise UsageError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 arithmetic (it came "
                         "with Ampere); use fp16 or auto")
    return DTYPES[precision], f"{precision}: set by --precision"
