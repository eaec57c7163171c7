"""`batch_size: auto`: one frame at a time on a CPU; on CUDA the batch a probe measured to run fastest per frame.

The probe times warp + decode per frame at batches 1, 2, 4, 8 and 16 the way the render loop runs them
(the next batch launched before the last one's crops are collected) and takes the smallest batch within
5% of the fastest whose peak memory stays under half the GPU's (the LMDM, HuBERT and the next batch need
the rest). It runs once per GPU model, torch and CUDA version, precision and warp/decoder checkpoints; the
verdict is kept in the store's probes/ folder, so later renders only read it. On a CPU batching bought
nothing steady (full size on a 2-core EPYC: fp32 batch 1 fastest; bf16 batch 4 between 4% slower and 12%
faster than 1 in alternating renders, for 0.7 GB more memory), so a CPU is not probed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from ditto_fast.checkpoints import CheckpointSet
from ditto_fast.render.fused import FusedRenderer
from ditto_fast.engine.precision import cpu_kind
from ditto_fast.engine.measurements import remembered, sample_inputs

SIZES = (1, 2, 4, 8, 16)
FRAMES = 16                # timed per size (at least two batches, after a warm-up)
CPU_CHOICE = "1: on a CPU a batch bought no steady speed (not probed)"
WITHIN = 1.05              # a bigger batch must be more than 5% faster per frame to be worth its memory and latency
MEMORY_SHARE = 0.5         # of the GPU's memory, the most a batch's warp + decode may take at its peak


def measure(warp_path: str | Path, decoder_path: str | Path, device: torch.device, dtype: torch.dtype,
            sizes: tuple[int, ...], frames: int) -> list[dict]:
    """Per batch size: warp + decode ms per frame over about `frames` frames (at least two batches, after a
    warm-up) and the peak device memory; sizes stop at the first that runs out of memory."""
    fused = FusedRenderer(warp_path, decoder_path, device, dtype)
    cuda = fused.device.type == "cuda"
    rows = []
    for batch in sizes:
        inputs = sample_inputs(fused, batch)
        try:
            fused(*inputs)                                   # warm-up: kernels chosen for this shape
            if cuda:
                torch.cuda.synchronize(fused.device)
                torch.cuda.reset_peak_memory_stats(fused.device)
            repeats = max(2, frames // batch)
            t0 = time.perf_counter()
            pending = fused.launch(*inputs)
            for _ in range(repeats - 1):                     # as the loop runs: next batch queued, then collect
                following = fused.launch(*inputs)
                fused.collect(pending)
                pending = following
            fused.collect(pending)
            seconds = time.perf_counter() - t0
        except RuntimeError as e:            # torch's OutOfMemoryError, or cuDNN/cuBLAS failing to allocate
            if not _out_of_memory(e):
                raise
            break
        rows.append({"batch": batch, "ms_per_frame": round(1000 * seconds / (repeats * batch), 3),
                     "peak_bytes": torch.cuda.max_memory_allocated(fused.device) if cuda else 0})
    del fused
    if cuda:
        torch.cuda.empty_cache()               # hand the probe's memory back (other renders may share the GPU)
    return rows


def _out_of_memory(e: RuntimeError) -> bool:
    """Whether `e` says the device ran out of memory."""
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e) or "ALLOC_FAILED" in str(e)


def choose(rows: list[dict], total_bytes: int = 0) -> int:
    """The smallest measured batch within WITHIN of the fastest per frame among those that fit in
    MEMORY_SHARE of `total_bytes` (0: no limit); 1 when none was measured."""
    fit = [r for r in rows if not total_bytes or r["peak_bytes"] <= MEMORY_SHARE * total_bytes]
    if not fit:
        return 1
    best = min(r["ms_per_frame"] for r in fit)
    return min(r["batch"] for r in fit if r["ms_per_frame"] <= WITHIN * best)


def measured_batch_size(checkpoints: CheckpointSet, device: torch.device, dtype: torch.dtype,
                        root: str | os.PathLike | None = None, sizes: tuple[int, ...] | None = None,
                        frames: int | None = None) -> tuple[int, str]:
    """(batch size, why) from the probe on `device`, run once and kept under the store's probes/ folder."""
    device = torch.device(device)
    sizes, frames = sizes or SIZES, frames or FRAMES
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, total = props.name, props.total_memory
    else:                                    # the same measurement on a CPU (its tests, benchmarks)
        name, total = json.dumps(cpu_kind()), 0
    fp = checkpoints.fingerprints()
    threads = torch.get_num_threads() if device.type == "cpu" else None      # a CPU's speed depends on them
    key = [name, total, torch.__version__, torch.version.cuda, threads, str(dtype), list(sizes),
           fp["warp_network"], fp["decoder"]]

    def run() -> dict:
        rows = measure(checkpoints.files["warp_network"], checkpoints.files["decoder"], device, dtype, sizes, frames)
        return {"device": name, "total_bytes": total, "dtype": str(dtype), "torch": torch.__version__,
                "rows": rows, "chosen": choose(rows, total)}

    verdict = remembered("batch", key, run, lambda v: v["chosen"] in {r["batch"] for r in v["rows"]} or
                         (v["chosen"] == 1 and v["rows"] == []), root)
    chosen = verdict["chosen"]
    if not verdict["rows"]:
        return 1, "1: the probe ran out of device memory even at batch 1"
    first, ms = verdict["rows"][0], {r["batch"]: r["ms_per_frame"] for r in verdict["rows"]}
    return chosen, (f"{chosen}: probed on this {'GPU' if device.type == 'cuda' else 'CPU'}, warp+decode "
                    f"{first['ms_per_frame']:.1f} ms/frame at batch {first['batch']}, {ms[chosen]:.1f} at {chosen} "
                    f"(the smallest within {round(100 * (WITHIN - 1))}% of the fastest)")


def auto_batch_size(checkpoints: CheckpointSet, device: torch.device, dtype: torch.dtype,
                    root: str | os.PathLike | None = None) -> tuple[int, str]:
    """(batch size, why) for `batch_size: auto`: 1 on a CPU, the kept probe's verdict on CUDA."""
    if torch.device(device).type != "cuda":
        return 1, CPU_CHOICE
    return measured_batch_size(checkpoints, device, dtype, root)
