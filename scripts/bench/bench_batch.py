"""Six short clips: six `ditto-fast render` processes against one `ditto-fast batch`, and Ray's start-up.

Both arms are `ditto-fast` processes timed from outside, so both pay Python's start and the imports.
Per-clip fixed cost = wall time less the per-frame stages (audio features, motion, stitch, render,
putback, write) of each clip, read from each render's timings / the batch's report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import anchor, checkpoints, save, speech

PER_FRAME = ("audio_features", "motion", "stitch", "render", "putback", "write")


def _cli(args: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ditto_fast.cli", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def run(out_json: str | None = None, quick: bool = False, tiny: bool = False) -> dict:
    ckpt = checkpoints(tiny=tiny)
    clips_n, seconds, steps = (3, 0.4, 2) if quick else (6, 0.08, 5)   # full size: 2 frames a clip (13 s each here)
    work = Path(tempfile.mkdtemp(prefix="bench_batch_"))
    env = {**os.environ, "DITTO_FAST_HOME": str(work / "home"), "DITTO_FAST_CHECKPOINTS": str(ckpt)}
    src = anchor(25, size=(1920, 1080))
    _cli(["register", str(src), "--name", "bench", "--force", "--quiet", "--device", "cpu"], env)
    audio = speech(seconds)
    precision = "auto"      # what a default render uses on this machine
    common = ["--device", "cpu", "--precision", precision, "--quiet"]

    # six separate processes
    separate, fixed_sep = 0.0, []
    for i in range(clips_n):
        prof = work / f"p{i}.json"
        wall = _cli(["render", "--avatar", "bench", "--audio", str(audio), "-o", str(work / f"r{i}.mp4"),
                     "--seed", str(i), "--steps", str(steps), "--timings", str(prof), *common], env)
        stages = json.loads(prof.read_text())["stages"]
        separate += wall
        fixed_sep.append(wall - sum(stages[k] for k in PER_FRAME))

    # one batch
    jobs = work / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"avatar": "bench", "audio": str(audio), "output": f"b{i}.mp4", "seed": i,
                                        "steps": steps}) + "\n" for i in range(clips_n)))
    report = work / "report.json"
    batch_wall = _cli(["batch", str(jobs), "--report", str(report), *common], env)
    done = json.loads(report.read_text())["jobs"]
    assert all(j["status"] == "done" for j in done), [j["error"] for j in done]
    per_frame = [sum(j["stages"][k] for k in PER_FRAME) for j in done]
    same = all((work / f"b{i}.mp4").read_bytes() == (work / f"r{i}.mp4").read_bytes() for i in range(clips_n))
    fixed_batch = (batch_wall - sum(per_frame)) / clips_n
    marginal = sum(j["seconds"] for j in done) / clips_n - sum(per_frame) / clips_n   # a job's own cost beyond its frames

    # Ray start-up: a local cluster with two actors, each checked and its setup resolved (the engine loads with an
    # actor's first job)
    ray_start = None
    try:
        import ray

        from ditto_fast.handles.ray_engine import EngineActor
        from ditto_fast.engine.options import EngineOptions

        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(work / "ray"))
        remote = ray.remote(num_cpus=1)(EngineActor)
        options = EngineOptions(device="cpu", precision=precision, checkpoints=str(ckpt))
        actors = [remote.remote(options, env["DITTO_FAST_HOME"], {}) for _ in range(2)]
        ray.get([a.ready.remote() for a in actors])
        ray_start = time.perf_counter() - t0
        ray.shutdown()
    except ImportError:
        pass

    from ditto_fast.engine.options import EngineOptions
    from ditto_fast.engine.render_setup import RenderSetup

    dtype = RenderSetup.resolve(EngineOptions(device="cpu", precision=precision, checkpoints=ckpt)).dtype
    mean_sep = sum(fixed_sep) / clips_n
    result = {"clips": clips_n, "audio_seconds": seconds, "steps": steps, "networks": "tiny" if tiny else "full",
              "precision": precision, "separate_wall_s": separate, "batch_wall_s": batch_wall,
              "fixed_per_clip_separate_s": mean_sep, "fixed_per_clip_batch_s": fixed_batch,
              "fixed_ratio": fixed_batch / mean_sep if mean_sep else None, "fixed_ratio_floor": 1 / clips_n,
              "marginal_per_clip_batch_s": marginal, "marginal_ratio": marginal / mean_sep if mean_sep else None,
              "same_bytes": same,
              "ray_two_actors_start_s": ray_start}
    print(f"{clips_n} clips of {seconds} s, {result['networks']} networks, precision {precision} "
          f"({dtype}), {steps} steps")
    print(f"  separate processes: {separate:8.1f} s wall, fixed cost {mean_sep:6.2f} s per clip")
    print(f"  one batch:          {batch_wall:8.1f} s wall, fixed cost {fixed_batch:6.2f} s per clip "
          f"({100 * result['fixed_ratio']:.1f}% of separate; one engine load shared by {clips_n} clips cannot go "
          f"below {100 / clips_n:.1f}%); same bytes: {same}")
    print(f"  each further clip in the batch: {marginal:6.2f} s beyond its frames "
          f"({100 * result['marginal_ratio']:.1f}% of a separate process's fixed cost)")
    if ray_start is not None:
        print(f"  Ray local start with two actors (no engine yet): {ray_start:.1f} s")
    return save(out_json, result)

