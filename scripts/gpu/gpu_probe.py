#!/usr/bin/env python
"""The GPU measurements that need only torch: the batch-size probe of `batch_size: auto` (full-size random
warp + decoder, fp16 and fp32) with its verdict, and each size's peak memory. It runs on a machine that
has torch and none of the render's other packages (no mediapipe, ffmpeg or HuBERT), e.g. the device
image as it is:

    python3 scripts/gpu/gpu_probe.py [--out bench_out/gpu_probe.json] [--device cuda] [--tiny]

`--device cpu --tiny` runs the same code on a CPU with tiny networks (the tests do).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))        # ditto_fast from this checkout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny networks (a quick check of the script itself)")
    ap.add_argument("--out", type=Path, default=Path("bench_out/gpu_probe.json"))
    args = ap.parse_args(argv)
    import torch

    from ditto_fast.checkpoints import MODELS_SUBDIR
    from ditto_fast.checkpoints.random_weights import write_random
    from ditto_fast.models import SPECS
    from ditto_fast.engine.batch_size import FRAMES, SIZES, choose, measure

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_probe: no CUDA device here (use --device cpu --tiny to try the script)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    result = {"device": name, "total_bytes": total, "torch": torch.__version__, "cuda": torch.version.cuda,
              "tiny": args.tiny, "precisions": {}}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        root = write_random(tmp, tiny=args.tiny, seed=0, networks=("warp_network", "decoder"), hubert=False)
        files = {n: root / MODELS_SUBDIR / SPECS[n].filename for n in ("warp_network", "decoder")}
        print(f"{name}, torch {torch.__version__} (CUDA {torch.version.cuda}); random "
              f"{'tiny' if args.tiny else 'full-size'} checkpoints written in {time.perf_counter() - t0:.1f} s")
        for label, dtype in (("fp16", torch.float16), ("fp32", torch.float32)):
            if device.type == "cpu" and dtype == torch.float16:
                continue                                      # not a CPU precision of ours
            t0 = time.perf_counter()
            rows = measure(files["warp_network"], files["decoder"], device, dtype, SIZES, FRAMES)
            chosen = choose(rows, total)
            result["precisions"][label] = {"rows": rows, "chosen": chosen, "probe_s": time.perf_counter() - t0}
            print(f"\n{label}: warp + decode per frame (the probe's {FRAMES} frames a size), "
                  f"probe {result['precisions'][label]['probe_s']:.1f} s")
            for r in rows:
                fps = 1000 / r["ms_per_frame"]
                print(f"  batch {r['batch']:>2}: {r['ms_per_frame']:8.2f} ms/frame = {fps:7.1f} fps, "
                      f"peak {r['peak_bytes'] / 2**30:6.2f} GiB" + ("   <- auto" if r["batch"] == chosen else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
