"""Benchmark one forward pass of each of the six Ditto networks at full size, per dtype and batch size,
and the SPADE decoder's reduced-precision image quality (PSNR against float32).

    python scripts/bench/bench_networks.py [--out bench_networks.json] [--quick] [--threads 2]

Weights are random (the published widths, folded for inference); timings do not depend on the values.
CPU runs float32 and bfloat16; CUDA, when present, runs float32 and float16 as well.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from ditto_fast import models

NETWORKS = ("appearance_extractor", "motion_extractor", "warp_network", "decoder", "stitch_network", "lmdm")


def _inputs(name: str, net: torch.nn.Module, batch: int, gen: torch.Generator, device: str) -> tuple:
    """Random inputs of the network's call contract (float32; the networks cast to their dtype)."""
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device)

    if name in ("appearance_extractor", "motion_extractor"):
        return (torch.rand(batch, 3, 256, 256, generator=gen).to(device),)
    if name == "warp_network":
        kp_s = 0.3 * randn(batch, 21, 3)
        return randn(batch, 32, 16, 64, 64), kp_s, kp_s + 0.03 * randn(batch, 21, 3)
    if name == "decoder":
        return (_realistic_feature(batch, gen).to(device),)
    if name == "stitch_network":
        return 0.3 * randn(batch, 21, 3), 0.3 * randn(batch, 21, 3)
    if name == "lmdm":
        t = torch.full((batch,), 517, dtype=torch.long, device=device)
        return randn(batch, net.seq_len, net.motion_dim), randn(batch, net.motion_dim), \
            randn(batch, net.seq_len, net.cond_dim), t
    raise ValueError(name)


def _realistic_feature(batch: int, gen: torch.Generator) -> torch.Tensor:
    """A decoder input with spatial structure: a smooth random field plus some fine detail, unit scale."""
    smooth = F.interpolate(torch.randn(batch, 256, 16, 16, generator=gen), size=(64, 64), mode="bilinear",
                           align_corners=False)
    x = smooth + 0.3 * torch.randn(batch, 256, 64, 64, generator=gen)
    return x / x.std()


def _time(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> dict:
    """Median and best wall time of fn over `repeats` runs after one warm-up."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times)}


def _build(name: str, device: str) -> torch.nn.Module:
    net = models.build(name).eval()
    if hasattr(net, "fuse_for_inference"):
        net.fuse_for_inference()
    for p in net.parameters():
        p.requires_grad_(False)
    return net.to(device)


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).square().mean().item()
    return float("inf") if mse == 0 else 10.0 * torch.log10(torch.tensor(1.0 / mse)).item()


def run(out_json: str | None, quick: bool = False, threads: int | None = None) -> dict:
    """Time every network (batch 1 and 4, each dtype), measure decoder PSNR; print a table, return the numbers."""
    if threads:
        torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = [torch.float32, torch.float16 if device == "cuda" else torch.bfloat16]
    batches = (1,) if quick else (1, 4)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    result: dict = {"device": device, "threads": torch.get_num_threads(), "quick": quick,
                    "dtypes": [str(d).removeprefix("torch.") for d in dtypes], "batches": list(batches),
                    "networks": {}}
    with torch.no_grad():
        for name in NETWORKS:
            try:
                base = _build(name, device)
            except (ImportError, AttributeError, TypeError, ValueError) as e:
                result["networks"][name] = {"status": "unavailable", "reason": f"{type(e).__name__}: {e}"}
                continue
            entry: dict = {"status": "ok"}
            for dtype in dtypes:
                net = copy.deepcopy(base).to(dtype) if dtype != torch.float32 else base
                for batch in batches:
                    gen = torch.Generator().manual_seed(batch)
                    x = _inputs(name, net, batch, gen, device)
                    repeats = (2 if quick else 3) if batch == 1 else 2
                    entry[f"{str(dtype).removeprefix('torch.')}_b{batch}"] = _time(lambda: net(*x), repeats, sync)
                if dtype != torch.float32:
                    del net
            result["networks"][name] = entry
            if name == "decoder":
                gen = torch.Generator().manual_seed(7)
                feat = _realistic_feature(1, gen).to(device)
                ref = base(feat).float()
                for dtype in dtypes[1:]:
                    low = copy.deepcopy(base).to(dtype)
                    result[f"decoder_psnr_{str(dtype).removeprefix('torch.')}_db"] = _psnr(low(feat).float(), ref)
            del base

    lo = result["dtypes"][1]
    nets = result["networks"]
    if all(nets.get(n, {}).get("status") == "ok" for n in ("warp_network", "decoder")):
        fp32 = sum(nets[n]["float32_b1"]["median_s"] for n in ("warp_network", "decoder"))
        low = sum(nets[n][f"{lo}_b1"]["median_s"] for n in ("warp_network", "decoder"))
        result["warp_decode_b1"] = {"float32_s": fp32, f"{lo}_s": low, "speedup": fp32 / low}

    _print_table(result)
    if out_json:
        with open(out_json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def _print_table(result: dict) -> None:
    cols = [f"{d}_b{b}" for d in result["dtypes"] for b in result["batches"]]
    print(f"Networks, full size, {result['device']}, {result['threads']} threads"
          f"{' (quick)' if result['quick'] else ''}: median seconds per forward")
    print(f"{'network':<22}" + "".join(f"{c:>14}" for c in cols))
    for name, entry in result["networks"].items():
        if entry["status"] != "ok":
            print(f"{name:<22}  unavailable ({entry['reason'][:60]})")
            continue
        print(f"{name:<22}" + "".join(f"{entry[c]['median_s']:>14.3f}" for c in cols))
    for key, val in result.items():
        if key.startswith("decoder_psnr_"):
            print(f"decoder PSNR {key.split('_')[2]} vs float32: {val:.1f} dB")
    if "warp_decode_b1" in result:
        wd = result["warp_decode_b1"]
        print(f"warp+decode batch 1: float32 {wd['float32_s']:.3f}s, {result['dtypes'][1]} "
              f"{wd[result['dtypes'][1] + '_s']:.3f}s, speed-up {wd['speedup']:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the numbers as JSON here")
    ap.add_argument("--quick", action="store_true", help="batch 1 only, fewer repeats")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    args = ap.parse_args()
    run(args.out, args.quick, args.threads)
