"""The warm engine: one clip's turnaround from a cold `ditto-fast render` process against `serve` (submit to the
output renamed: the job's "finished" time, which the server sets once the output is renamed), 20 jobs at once
against `batch` of the same 20, and a breaking job's wait behind 10 normal ones. Jobs are polled every 0.25 s, as
a client would: polling at 100 Hz took CPU from the render on two cores.

Fixed cost per clip = turnaround less the clip's own stages (audio features, motion, stitch, render, putback,
write) from its timings; in the server that is the queue, the checks and the HTTP round trips.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_common import anchor, checkpoints, save, speech

PER_CLIP = ("audio_features", "motion", "stitch", "render", "putback", "write")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(port: int, method: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _wait(port: int, job_id: str, poll: float = 0.25) -> dict:
    while True:
        job = _call(port, "GET", f"/v1/jobs/{job_id}")
        if job["status"] in ("done", "failed", "cancelled"):
            assert job["status"] == "done", job
            return job
        time.sleep(poll)


def _own(timings: dict) -> float:
    return sum(timings["stages"][k] for k in PER_CLIP)


def run(out_json: str | None = None, quick: bool = False, tiny: bool = False) -> dict:
    ckpt = checkpoints(tiny=tiny)
    work = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    env = {**os.environ, "DITTO_FAST_HOME": str(work / "home"), "DITTO_FAST_CHECKPOINTS": str(ckpt)}
    cli = [sys.executable, "-m", "ditto_fast.cli"]
    subprocess.run([*cli, "register", str(anchor(25, size=(1920, 1080))), "--name", "bench", "--quiet", "--device",
                    "cpu"], check=True, env=env, stdout=subprocess.DEVNULL)
    seconds = 4.0 if tiny else 0.4           # full size: 10 frames (seconds a frame on a CPU; the fixed cost is the same)
    clip = Path(shutil.copy(speech(seconds), work / "clip.wav"))
    short = Path(shutil.copy(speech(0.4), work / "short.wav"))
    common = ["--device", "cpu", "--quiet"]

    # a cold process
    t0 = time.perf_counter()
    subprocess.run([*cli, "render", "--avatar", "bench", "--audio", str(clip), "-o", str(work / "cold.mp4"),
                    "--timings", str(work / "cold.json"), *common], check=True, env=env)
    cold = time.perf_counter() - t0
    cold_own = _own(json.loads((work / "cold.json").read_text()))

    port = _free_port()
    proc = subprocess.Popen([*cli, "serve", "--port", str(port), "--root", str(work), *common], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        t0 = time.perf_counter()
        while True:
            try:
                _call(port, "GET", "/healthz")
                break
            except OSError:
                assert proc.poll() is None, "serve did not start"
                time.sleep(0.05)
        start = time.perf_counter() - t0
        # warm turnaround: the first job pays nothing more; take the median of a few
        warm = []
        for i in range(1 if quick or not tiny else 3):
            t0 = time.time()
            job = _wait(port, _call(port, "POST", "/v1/jobs", {"avatar": "bench", "audio": str(clip), "seed": i + 1,
                                                                "output": str(work / f"warm{i}.mp4")})["id"])
            warm.append((job["finished"] - t0, _own(job["timings"])))
        warm.sort()
        warm_wall, warm_own = warm[len(warm) // 2]

        result = {"networks": "tiny" if tiny else "full", "clip_seconds": seconds, "cold_turnaround_s": cold,
                  "cold_fixed_s": cold - cold_own, "serve_start_s": start, "warm_turnaround_s": warm_wall,
                  "warm_fixed_s": warm_wall - warm_own}
        if not tiny:        # the queue's figures need many short renders: tiny networks only
            return _report(out_json, result)
        # 20 jobs at once against one batch of the same 20
        n = 6 if quick else 20
        t0 = time.time()
        ids = [_call(port, "POST", "/v1/jobs", {"avatar": "bench", "audio": str(short), "seed": 100 + i,
                                                "output": str(work / f"s{i}.mp4")})["id"] for i in range(n)]
        served = max(_wait(port, i)["finished"] for i in ids) - t0

        # a breaking job behind 10 normal ones
        normal = [_call(port, "POST", "/v1/jobs", {"avatar": "bench", "audio": str(short), "seed": 200 + i,
                                                   "output": str(work / f"n{i}.mp4")})["id"] for i in range(10)]
        while _call(port, "GET", f"/v1/jobs/{normal[0]}")["status"] != "running":
            time.sleep(0.05)
        submitted = time.time()
        breaking = _wait(port, _call(port, "POST", "/v1/jobs", {"avatar": "bench", "audio": str(short),
                                                                "priority": "breaking", "seed": 300,
                                                                "output": str(work / "breaking.mp4")})["id"])
        running = _call(port, "GET", f"/v1/jobs/{normal[0]}")
        wait_s, remainder = breaking["started"] - submitted, running["finished"] - submitted
        for i in normal:
            _wait(port, i)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    jobs = work / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"avatar": "bench", "audio": str(short), "output": f"b{i}.mp4",
                                        "seed": 100 + i}) + "\n" for i in range(n)))
    t0 = time.perf_counter()
    subprocess.run([*cli, "batch", str(jobs), *common], check=True, env=env, stdout=subprocess.DEVNULL)
    batch = time.perf_counter() - t0
    same = all((work / f"b{i}.mp4").read_bytes() == (work / f"s{i}.mp4").read_bytes() for i in range(n))
    result.update({"jobs": n, "served_wall_s": served, "batch_wall_s": batch, "served_vs_batch": served / batch,
                   "same_bytes_as_batch": same, "breaking_wait_s": wait_s, "running_remainder_s": remainder})
    return _report(out_json, result)


def _report(out_json: str | None, r: dict) -> dict:
    print(f"{r['networks']} networks, a {r['clip_seconds']:g} s clip, 1080p avatar:")
    print(f"  cold `render` process: {r['cold_turnaround_s']:6.2f} s turnaround, {r['cold_fixed_s']:5.2f} s of it "
          "fixed")
    print(f"  warm `serve`:          {r['warm_turnaround_s']:6.2f} s turnaround, {r['warm_fixed_s']:5.2f} s of it "
          f"fixed (server start {r['serve_start_s']:.1f} s, paid once)")
    if "jobs" in r:
        print(f"  {r['jobs']} short jobs at once: served {r['served_wall_s']:.1f} s, `batch` {r['batch_wall_s']:.1f} s "
              f"({100 * r['served_vs_batch']:.0f} %); same bytes: {r['same_bytes_as_batch']}")
        print(f"  breaking job behind 10: waited {r['breaking_wait_s']:.2f} s; the running job had "
              f"{r['running_remainder_s']:.2f} s left")
    return save(out_json, r)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--full", action="store_true", help="full-size networks (a 10-frame clip; turnaround only)")
    a = ap.parse_args()
    run("bench_out/bench_serve.json", quick=a.quick, tiny=not a.full)
