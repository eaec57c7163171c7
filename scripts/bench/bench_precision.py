"""`--precision auto`'s CPU rule checked by the clock: full-size warp + decode (the networks the precision applies
to) per frame in fp32 and in bf16, per CPU kind, and whether the rule's choice (engine/precision.py `cpu_rule`) is
the faster one.

The verdict is this CPU's: is the rule's choice for its flags the faster here? For reference it also times the
kinds below it that this CPU can stand in for by capping oneDNN's instruction set (ONEDNN_MAX_CPU_ISA) and ATen's
(ATEN_CPU_CAPABILITY): AVX512-BF16 without AMX, AVX-512 without bf16, AVX2 only. A capped kind is this CPU's
cores running another kind's kernels, not that kind's silicon (an AMD Zen 4's bf16 dot products, its FMA ports,
clocks and caches are its own), so those rows inform the rule but do not settle it. Each kind and precision runs
in a fresh process (one warm-up frame, then the timed frames); a bf16 that passes `limit` seconds is stopped and
counted as slower than that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_common import REPO, checkpoints, save

# (kind, the flags it stands for, the caps that make this CPU run its kernels, the flags this CPU needs for that)
KINDS = [
    ("this CPU", None, {}, set()),
    ("AVX512-BF16, no AMX", {"avx2", "avx512f", "avx512_bf16"},
     {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "avx512"}, {"avx512_bf16"}),
    ("AVX-512, no bf16", {"avx2", "avx512f"},
     {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI", "ATEN_CPU_CAPABILITY": "avx512"}, {"avx512f"}),
    ("AVX2 only", {"avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}, {"avx2"}),
]

CHILD = """
import json, sys, time
import numpy as np, torch
sys.path.insert(0, {repo!r})
from ditto_fast.checkpoints import find_checkpoints
from ditto_fast.engine.measurements import sample_inputs
from ditto_fast.render.fused import FusedRenderer
files = find_checkpoints({ckpt!r}, need_hubert=False, networks=("warp_network", "decoder")).files
fused = FusedRenderer(files["warp_network"], files["decoder"], torch.device("cpu"), getattr(torch, {dtype!r}))
inputs = sample_inputs(fused, 1)
fused(*inputs)                                  # warm-up: kernels chosen, memory laid out
seconds = []
for _ in range({frames}):
    t0 = time.perf_counter()
    crop = fused(*inputs)
    seconds.append(time.perf_counter() - t0)
np.save({crop_path!r}, crop)
print(json.dumps({{"s_per_frame": min(seconds), "rounds": seconds}}))
"""


def _time(ckpt: Path, dtype: str, frames: int, caps: dict, crop_path: Path, limit: float) -> dict:
    """Seconds per frame (best of `frames`) of warp + decode in `dtype` in a fresh process with `caps` in its
    environment; {"over_s": limit} when it ran past `limit` seconds."""
    code = CHILD.format(repo=str(REPO), ckpt=str(ckpt), dtype={"fp32": "float32", "bf16": "bfloat16"}[dtype],
                        frames=frames, crop_path=str(crop_path))
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit,
                             env={**os.environ, **caps}, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"over_s": limit}
    if res.returncode != 0:
        raise RuntimeError(f"warp + decode child failed ({dtype}, {caps}): {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(out_json: str | None = None, quick: bool = False, limit: float = 240.0) -> dict:
    from ditto_fast.engine.precision import KIND_FLAGS, cpu_flags, cpu_kind, cpu_rule, psnr

    here, kind = cpu_flags(), cpu_kind()
    ckpt = checkpoints(tiny=False, networks=("warp_network", "decoder"), hubert=False)
    frames = 1 if quick else 3
    rows = []
    print(f"CPU: {kind['model']} ({', '.join(kind['flags']) or 'none of ' + ', '.join(KIND_FLAGS)}); "
          f"{os.cpu_count()} cores; full-size warp + decode, s/frame, best of {frames} after a warm-up")
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags, caps, needs in KINDS:
            if not needs <= here:
                continue
            flags = here if flags is None else flags
            choice, why = cpu_rule(flags)
            got = {p: _time(ckpt, p, frames, caps, Path(tmp, f"{p}.npy"), limit) for p in ("fp32", "bf16")}
            secs = {p: got[p].get("s_per_frame", got[p].get("over_s", float("inf"))) for p in got}
            faster = min(secs, key=secs.get)
            done = all("s_per_frame" in g for g in got.values())
            quality = psnr(np.load(Path(tmp, "fp32.npy")), np.load(Path(tmp, "bf16.npy"))) if done else None
            rows.append({"kind": name, "flags": sorted(f for f in flags if f in KIND_FLAGS), "caps": caps,
                         "rule": choice, "why": why, "fp32": got["fp32"], "bf16": got["bf16"], "faster": faster,
                         "rule_is_faster": choice == faster, "bf16_psnr_db": quality})
            shown = {p: f"{secs[p]:.2f}" if "s_per_frame" in got[p] else f"> {limit:.0f}" for p in secs}
            verdict = "the faster" if choice == faster else "the slower"
            print(f"  {name + ('' if not caps else ' (capped)'):32s} fp32 {shown['fp32']:>7s}  bf16 {shown['bf16']:>7s}  "
                  f"rule: {choice}, {verdict}" + (f"  (bf16 PSNR {quality:.1f} dB)" if quality else ""), flush=True)
    here_row = rows[0]
    print(f"On this CPU kind the rule picks {here_row['rule']} ({here_row['why']}): "
          f"{'the faster' if here_row['rule_is_faster'] else 'NOT the faster'}.")
    result = {"cpu": kind["model"], "flags": kind["flags"], "cores": os.cpu_count(), "frames": frames,
              "measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "kinds": rows,
              "rule_is_faster_here": here_row["rule_is_faster"]}
    return save(out_json, result)
