"""Benchmark: time load_avatar() on a 200-frame full-size avatar (f_s [200,32,16,64,64] float16, 800 MiB).

Writes the avatar into a temporary store with AvatarWriter, every frame with write_f_s() in batches
of 16 as registration does (quick: one random batch repeated), then times load_avatar() at
verify="sampled" (the render default; target <= 0.3 s), "light" and, unless quick, "full". Usage: python scripts/bench/bench_avatar_load.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ditto_fast.avatar import AvatarWriter, load_avatar
from ditto_fast.avatar.format import F_S_TAIL_FULL, AvatarRecord
from ditto_fast.core.keypoint_info import X_S_INFO_WIDTHS

N_FRAMES = 200
TARGET_S = 0.3
BATCH = 16


def _meta(n: int, rng: np.random.Generator) -> AvatarRecord:
    """Synthetic registration output for n frames."""
    x = {k: rng.standard_normal((n, d)).astype(np.float32) for k, d in X_S_INFO_WIDTHS.items()}
    return AvatarRecord(
        source={"path": "bench.mp4", "sha256": "0" * 64, "fps": 25.0, "size": (1920, 1080), "n_frames": n},
        fingerprints={"appearance_extractor": "bench", "motion_extractor": "bench"},
        crop={"scale": 2.3, "vx": 0.0, "vy": -0.125},
        x_s_info=x,
        M_c2o=rng.standard_normal((n, 3, 3)),
        eye_open=rng.random((n, 2), dtype=np.float32),
        eye_ball=rng.random((n, 6), dtype=np.float32),
        sc=rng.standard_normal(63).astype(np.float32),
        is_image=False,
        random_weights=True,
    )


def _time_load(root: Path, verify: str, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        av = load_avatar("bench", verify=verify, root=root)
        times.append(time.perf_counter() - t0)
        assert isinstance(av.f_s, np.memmap) and av.f_s.shape == (N_FRAMES, *F_S_TAIL_FULL)
    return times


def run(out_json: str | Path | None = None, quick: bool = True) -> dict:
    """Write a 200-frame full-shape avatar to a temp store, time load_avatar, return (and save) results."""
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="ditto-bench-avatar-") as tmp:
        root = Path(tmp)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        with AvatarWriter("bench", root=root) as w:
            w.open_f_s(N_FRAMES, F_S_TAIL_FULL)  # [200, 32, 16, 64, 64] float16
            # rows go in order (the writer's contract); quick repeats one random batch instead of drawing all
            batch = rng.standard_normal((BATCH, *F_S_TAIL_FULL), dtype=np.float32).astype(np.float16)
            for i in range(0, N_FRAMES, BATCH):
                j = min(i + BATCH, N_FRAMES)
                rows = batch[:j - i] if quick else \
                    rng.standard_normal((j - i, *F_S_TAIL_FULL), dtype=np.float32).astype(np.float16)
                w.write_f_s(i, rows)
            w.plate_path(False).write_bytes(rng.bytes(4 << 20))
            t_fill = time.perf_counter() - t0
            d = w.finish(_meta(N_FRAMES, rng))
        t_write = time.perf_counter() - t0
        rss_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024

        f_s_bytes = (d / "f_s.npy").stat().st_size
        load_avatar("bench", root=root)  # first open (page cache of the sampled blocks)
        sampled_times = _time_load(root, "sampled", 3 if quick else 7)
        light_times = _time_load(root, "light", 3 if quick else 7)
        full_times = [] if quick else _time_load(root, "full", 1)

    med = statistics.median(sampled_times)
    result = {
        "bench": "avatar_load",
        "quick": quick,
        "frames": N_FRAMES,
        "f_s_shape": [N_FRAMES, *F_S_TAIL_FULL],
        "f_s_bytes": f_s_bytes,
        "write_fill_s": round(t_fill, 3),
        "write_total_s": round(t_write, 3),
        "writer_max_rss_growth_mb": round(rss_growth_mb, 1),
        "load_sampled_median_s": round(med, 4),
        "load_sampled_max_s": round(max(sampled_times), 4),
        "load_light_median_s": round(statistics.median(light_times), 4),
        "load_full_s": round(full_times[0], 3) if full_times else None,
        "target_s": TARGET_S,
        "pass": med <= TARGET_S,
    }
    print(f"{'metric':<28} value")
    for k, v in result.items():
        print(f"{k:<28} {v}")
    if out_json:
        Path(out_json).write_text(json.dumps(result, indent=2) + "\n")
    return result
