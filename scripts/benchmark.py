#!/usr/bin/env python
"""ditto-fast benchmarks. Each subcommand prints a table and writes JSON (default bench_out/<name>.json).

    python scripts/benchmark.py networks [--quick]
    python scripts/benchmark.py register [--quick] [--tiny]
    python scripts/benchmark.py motion   [--quick]
    python scripts/benchmark.py render   [--quick] [--tiny]
    python scripts/benchmark.py batch    [--quick] [--tiny]
    python scripts/benchmark.py serve    [--quick] [--tiny]   cold render vs warm serve (--tiny: 20 jobs vs batch, breaking)
    python scripts/benchmark.py live     [--quick]          speech piped into `live`: latency, RTF per stage, tiny 720p/1080p, full 720p
    python scripts/benchmark.py pipecat  [--quick]          a Pipecat pipeline with DittoFastVideoService (second stack): latency, RTF
    python scripts/benchmark.py sessions [--quick]          live sessions sharing one engine: memory and CPU per session
    python scripts/benchmark.py picture  [--quick]          per kind of source: plate, times, colour patches
    python scripts/benchmark.py plate    [--quick]          a grainy 720p camera clip: plate size, decode cost, error
    python scripts/benchmark.py delivery [--quick]          per profile: 10 s render and its QC, encoder cost, loudness
    python scripts/benchmark.py captions [--quick]          caption display frame vs cue (MXF/MP4/MOV), alignment cost
    python scripts/benchmark.py emotion  [--quick]          --emotion auto: the classifier per minute of speech, what auto adds to a render
    python scripts/benchmark.py cpu      [--quick]          full-size warp+decode: default render vs plain fp32
    python scripts/benchmark.py precision [--quick]         fp32 vs bf16 per CPU kind: is --precision auto's rule the faster
    python scripts/benchmark.py all      [--quick]

Figures are measured in one run on whatever machine this is; compare ratios within a run.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "bench"), str(HERE / "support")]

# subcommand -> modules whose run(out_json, quick) it calls, in order
SUITES = {
    "networks": ["bench_networks", "bench_rewrites"],
    "register": ["bench_register", "bench_avatar_load"],
    "motion": ["bench_hubert", "bench_lmdm", "bench_motion"],
    "render": ["bench_putback", "bench_seam", "bench_render", "bench_cli_render"],
    "picture": ["bench_picture"],
    "plate": ["bench_plate"],
    "delivery": ["bench_delivery"],
    "captions": ["bench_captions"],
    "emotion": ["bench_emotion"],
    "batch": ["bench_batch"],
    "serve": ["bench_serve"],
    "live": ["bench_live", "bench_live_cushion"],
    "voice": ["bench_voice"],
    "pipecat": ["bench_pipecat"],
    "sessions": ["bench_sessions"],
    "cpu": ["bench_cpu_speed"],
    "precision": ["bench_precision"],
}


def machine() -> dict:
    """What the figures were measured on."""
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor(),
            "threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=[*SUITES, "all"])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and smaller inputs")
    ap.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for JSON results")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny networks where a suite allows it (register: non-network stages at full length)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads, here and in the benchmark's child processes "
                         "(default: torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:    # before torch starts here; the benchmark's child processes inherit it
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    results = {"machine": machine(), "quick": args.quick, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for suite in suites:
        for mod_name in SUITES[suite]:
            print(f"\n== {suite}: {mod_name}", flush=True)
            mod = importlib.import_module(mod_name)
            extra = {"tiny": True} if args.tiny and "tiny" in inspect.signature(mod.run).parameters else {}
            results[mod_name] = mod.run(str(args.out / f"{mod_name}.json"), quick=args.quick, **extra)
    path = args.out / f"{args.suite}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
