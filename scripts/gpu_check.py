#!/usr/bin/env python
"""One prepared GPU check: full-size fp16 renders into a 1080p avatar at batch 1/4/8 and the batch-size
probe's choice, with and without look-ahead, x264 and NVENC; prints fps and each stage's ms/frame and
writes JSON.

    python scripts/gpu_check.py [--seconds 20] [--long 60] [--out bench_out/gpu_check.json]

The matrix renders `--seconds` of speech per setting; one more render of `--long` seconds uses the
fastest setting. Random full-size weights (the timing is the same as with trained ones).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--long", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("bench_out/gpu_check.json"))
    args = ap.parse_args(argv)
    import os

    import torch

    from bench_common import anchor, checkpoints, speech
    from ditto_fast.engine.renderer import Renderer, STAGES
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.render.formats import nvenc_works

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    ckpt = checkpoints(tiny=False)
    home = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    os.environ["DITTO_FAST_HOME"] = str(home)
    from ditto_fast.avatar.register import Registrar

    Registrar(ckpt, "cuda").register(anchor(100), "gpu", force=True)
    engine = Renderer(ckpt, device="cuda", precision="fp16")
    base_setup, base_cfg = engine.setup, engine.config
    nvenc = nvenc_works("h264")[0]
    print(f"{torch.cuda.get_device_name(0)}; models loaded (with the batch-size probe) in {engine.load_seconds:.1f} s; "
          f"NVENC {'works' if nvenc else 'does not work: ' + nvenc_works('h264')[1]}", flush=True)
    print(f"batch_size auto: {base_setup.batch_choice}", flush=True)

    def run(seconds: float, bs: int, ahead: bool, use_nvenc: bool) -> dict:
        engine.setup = dataclasses.replace(base_setup, batch_size=bs, nvenc=use_nvenc)
        engine.config = dataclasses.replace(base_cfg, render=dataclasses.replace(base_cfg.render, lookahead=ahead))
        res = engine.render(RenderRequest("gpu", speech(seconds), home / f"out_{bs}_{ahead}_{use_nvenc}.mp4"))
        p = res.profile
        per = {k: 1000 * p["stages"][k] / p["frames"] for k in STAGES if k not in ("load_models", "load_avatar")}
        loop_cpu = 1000 * sum(p["stages_cpu"][k] for k in ("stitch", "putback", "write")) / p["frames"]
        return {"batch": bs, "lookahead": ahead, "encoder": p["encoder"], "frames": p["frames"], "fps": p["fps"],
                "ms_per_frame": per, "loop_thread_cpu_ms": loop_cpu}

    engine.render(RenderRequest("gpu", speech(2.0), home / "warmup.mp4"))                      # cuDNN autotune, allocator
    rows = []
    header = (f"{'batch':>5} {'ahead':>5} {'encoder':>11} {'fps':>7} " + " ".join(f"{k[:9]:>9}" for k in STAGES[2:])
              + f" {'loop cpu':>9}")     # the loop thread's own CPU in stitch + putback + write
    print(header)
    sizes = sorted({1, 4, 8, base_setup.batch_size})         # the probe's choice among them
    for use_nvenc in ([False, True] if nvenc else [False]):
        for bs in sizes:
            for ahead in (False, True):
                r = run(args.seconds, bs, ahead, use_nvenc)
                rows.append(r)
                print(f"{bs:>5} {str(ahead):>5} {r['encoder']:>11} {r['fps']:7.1f} "
                      + " ".join(f"{r['ms_per_frame'][k]:9.1f}" for k in STAGES[2:])
                      + f" {r['loop_thread_cpu_ms']:9.1f}", flush=True)
    best = max(rows, key=lambda r: r["fps"])
    long = run(args.long, best["batch"], best["lookahead"], best["encoder"].endswith("nvenc"))
    print(f"{args.long:g} s of audio at the fastest setting (batch {best['batch']}, look-ahead {best['lookahead']}, "
          f"{best['encoder']}): {long['fps']:.1f} fps; whole check {time.perf_counter() - t0:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "batch_choice": base_setup.batch_choice,
                                    "matrix": rows, "long": long}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
