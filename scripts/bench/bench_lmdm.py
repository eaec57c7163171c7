"""Benchmark the full-size LMDM on CPU: one guided denoising step batched vs two passes, and whole DDIM windows.

    python scripts/bench/bench_lmdm.py [--out bench_lmdm.json] [--quick]

Weights are random (the published widths); timings do not depend on the values.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable

import torch

from ditto_fast import models
from ditto_fast.motion.ddim import DDIMSampler
from reference import lmdm_two_pass


def _time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time in seconds of each fn, run round-robin (after one warm-up each) so load drift hits all alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _bench_dtype(dtype: torch.dtype, quick: bool) -> dict:
    torch.manual_seed(0)
    net = models.build("lmdm").eval().to(dtype)
    for p in net.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, net.seq_len, net.motion_dim, generator=g)
    cond_frame = torch.randn(1, net.motion_dim, generator=g)
    cond = torch.randn(1, net.seq_len, net.cond_dim, generator=g)
    t = torch.tensor([517])
    reps = 3 if quick else 7
    out: dict = {}
    with torch.no_grad():
        enc = net.encode_condition(cond)
        out.update(_time_interleaved({
            "step_batched_s": lambda: net(x, cond_frame, cond, t),
            "step_two_pass_s": lambda: lmdm_two_pass(net, x, cond_frame, cond, t),
            "step_batched_cached_cond_s": lambda: net.guided(x, cond_frame, enc, t),
        }, reps))
        out["ratio_two_pass_over_batched"] = out["step_two_pass_s"] / out["step_batched_s"]
        out["ratio_two_pass_over_batched_cached"] = out["step_two_pass_s"] / out["step_batched_cached_cond_s"]
        for steps in ((25,) if quick else (25, 50)):
            t0 = time.perf_counter()
            DDIMSampler(net, steps)(cond_frame, cond, torch.Generator().manual_seed(1))
            out[f"ddim_{steps}_steps_s"] = time.perf_counter() - t0
    return out


def run(out_json: str | None, quick: bool = False, threads: int | None = None) -> dict:
    """Run the LMDM benchmark (float32, then bf16), print a table, optionally write JSON; return the numbers.

    `threads` sets torch's intra-op threads (on a shared, loaded machine 1 gives the steadiest numbers).
    """
    if threads:
        torch.set_num_threads(threads)
    result = {"device": "cpu", "threads": torch.get_num_threads(), "quick": quick, "window_frames": 80,
              "float32": _bench_dtype(torch.float32, quick)}
    result["bfloat16"] = _bench_dtype(torch.bfloat16, quick)
    rows = [
        ("one step, cond+uncond in one batch", "step_batched_s"),
        ("one step, condition pre-encoded (sampler)", "step_batched_cached_cond_s"),
        ("one step, two separate passes", "step_two_pass_s"),
        ("speed-up: two passes / one batch", "ratio_two_pass_over_batched"),
        ("speed-up: two passes / pre-encoded batch", "ratio_two_pass_over_batched_cached"),
        ("DDIM 25 steps, one 80-frame window", "ddim_25_steps_s"),
        ("DDIM 50 steps, one 80-frame window", "ddim_50_steps_s"),
    ]
    print(f"LMDM full size, CPU, {result['threads']} threads{' (quick)' if quick else ''}")
    print(f"{'measure':<44} {'float32':>10} {'bfloat16':>10}")
    for label, key in rows:
        if key not in result["float32"]:
            continue
        unit = "x" if key.startswith("ratio") else "s"
        vals = [f"{result[d][key]:.3f}{unit}" for d in ("float32", "bfloat16")]
        print(f"{label:<44} {vals[0]:>10} {vals[1]:>10}")
    if out_json:
        with open(out_json, "w") as f:
            json.dump(result, f, indent=2)
    return result
