"""The render's precision, decided here alone: `--precision`, `auto` (fp16 on CUDA; on a CPU the fastest of fp32
and bf16 that keeps the decoder within 45 dB of fp32) and the $DITTO_FAST_CPU_PRECISION pin.

bf16 pays only where the CPU does bf16 arithmetic (AVX512-BF16 or AMX); elsewhere it is emulated and
slower, and fp32 is chosen without a probe. Where it may pay, one probe per CPU kind, torch version and
warp/decoder checkpoints times one full-size warp + decode in each precision and compares the crops; the
verdict is kept in the store (`probes/`), so later renders only read it. $DITTO_FAST_CPU_PRECISION (fp32 or
bf16) pins the choice instead.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from ditto_fast.checkpoints import CheckpointSet
from ditto_fast.core.config import PRECISIONS
from ditto_fast.core.errors import UsageError
from ditto_fast.render.fused import FusedRenderer
from ditto_fast.engine.measurements import remembered, sample_inputs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}   # each of PRECISIONS but auto
MIN_PSNR_DB = 45.0
# pins what auto picks on every CPU (one precision, so the same bytes, on a farm of mixed CPU kinds)
PIN_ENV = "DITTO_FAST_CPU_PRECISION"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_kind() -> dict:
    """The CPU's model name and the flags that decide how it ranks precisions."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("unknown", "x86_64", ""):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    keep = sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"))
    return {"model": model, "flags": keep}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB between two uint8 images (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)


def probe(warp_path: str | Path, decoder_path: str | Path, min_psnr_db: float = MIN_PSNR_DB) -> dict:
    """Time one warp + decode in fp32 and bf16 (after a warm-up each) on a fixed input and compare the crops."""
    seconds, crops = {}, {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        fused = FusedRenderer(warp_path, decoder_path, torch.device("cpu"), dtype)
        inputs = sample_inputs(fused, 1)
        fused(*inputs)                                                   # warm-up: kernels chosen, memory laid out
        t0 = time.perf_counter()
        crops[name] = fused(*inputs)
        seconds[name] = time.perf_counter() - t0
    quality = psnr(crops["fp32"], crops["bf16"])
    chosen = "bf16" if seconds["bf16"] < seconds["fp32"] and quality >= min_psnr_db else "fp32"
    return {"fp32_s": round(seconds["fp32"], 4), "bf16_s": round(seconds["bf16"], 4),
            "psnr_db": round(quality, 2), "min_psnr_db": min_psnr_db, "chosen": chosen}


def cpu_precision(checkpoints: CheckpointSet, root: str | os.PathLike | None = None) -> tuple[torch.dtype, str]:
    """(dtype, why) for `--precision auto` on this CPU: fp32 without native bf16, else the probe's verdict
    (run once and kept under the store's probes/ folder; an unwritable store just probes again next time)."""
    pinned = os.environ.get(PIN_ENV, "")
    if pinned:
        if pinned not in ("fp32", "bf16"):
            raise UsageError(f"{PIN_ENV}={pinned}: use fp32 or bf16 (or unset it to let each CPU choose)")
        return (torch.bfloat16 if pinned == "bf16" else torch.float32), f"{pinned}: pinned by {PIN_ENV}"
    kind = cpu_kind()
    if not any(f in kind["flags"] for f in BF16_FLAGS):
        return torch.float32, "fp32: this CPU has no bf16 arithmetic (no AVX512-BF16 or AMX)"
    fp = checkpoints.fingerprints()
    verdict = remembered(
        "precision", [kind, torch.__version__, fp["warp_network"], fp["decoder"]],
        lambda: {**probe(checkpoints.files["warp_network"], checkpoints.files["decoder"]), "cpu": kind,
                 "torch": torch.__version__},
        lambda v: v["chosen"] in ("fp32", "bf16"), root)
    why = (f"{verdict['chosen']}: probed on this CPU, warp+decode fp32 {verdict['fp32_s']:.2f} s, "
           f"bf16 {verdict['bf16_s']:.2f} s, bf16 PSNR {verdict['psnr_db']:.1f} dB (needs {verdict['min_psnr_db']:g})")
    return (torch.bfloat16 if verdict["chosen"] == "bf16" else torch.float32), why


def choose_precision(precision: str, device: torch.device, checkpoints: CheckpointSet | None = None
                     ) -> tuple[torch.dtype, str]:
    """(dtype, why auto chose it) for `--precision`: 'auto' -> float16 on CUDA, on a CPU `cpu_precision` (the pin
    or the probe of `checkpoints`); fp16 on a CPU (slow and lossy there) and bf16 on a GPU without it are refused."""
    if precision == "auto":
        return (torch.float16, "") if device.type == "cuda" else cpu_precision(checkpoints)
    if precision not in DTYPES:
        raise UsageError(f"--precision {precision}: use {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}")
    if precision == "fp16" and device.type == "cpu":
        raise UsageError("--precision fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise UsageError(f"--precision bf16: {torch.cuda.get_device_name(device)} has no bf16 arithmetic (it came "
                         "with Ampere); use fp16 or auto")
    return DTYPES[precision], ""
