#!/usr/bin/env python
"""Crash test: `ditto-fast batch` of 10 short jobs is killed with SIGKILL at a random moment, then run again.

    python scripts/faults/crash_test.py [--repeats 20] [--seed 0] [--json crash.json]

Each repeat starts from an empty output folder, starts the batch, SIGKILLs its Python process at a
random point of a clean run's duration (4 in 5 while it renders, after start-up; its ffmpeg children
are left to finish on their own, as after an OOM kill), and runs the same batch again to the end. Then every output must exist, decode to the
right number of frames, equal a clean run's frames, and no temporary file may be left in the output
folder or the avatar store. Tiny random checkpoints, CPU. Prints the figure, writes every repeat to the JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "support"))   # the synthetic anchor
JOBS = 10


def decoded_frames(path: Path) -> tuple[int, str]:
    """(frames, sha256 of all decoded RGB frames) of a video."""
    import imageio_ffmpeg

    gen = imageio_ffmpeg.read_frames(str(path))
    next(gen)
    h, n = hashlib.sha256(), 0
    for frame in gen:
        h.update(frame)
        n += 1
    return n, h.hexdigest()


def leftovers(*folders: Path) -> list[str]:
    """Hidden or temporary entries (.part, .probe, .tmp) under the folders."""
    found = []
    for folder in folders:
        for p in folder.rglob("*"):
            if p.name.startswith(".") or ".part" in p.name or p.name.endswith(".tmp"):
                found.append(str(p.relative_to(folder.parent)))
    return sorted(found)


def setup(work: Path) -> tuple[dict, Path]:
    """Tiny checkpoints, an avatar 'base' and 10 clips; returns (environment, folder of clips)."""
    import soundfile as sf

    from ditto_fast.checkpoints.random_weights import write_random
    from synthetic import Motion, write_anchor_video

    ckpt = work / "ckpt"
    write_random(ckpt, tiny=True, seed=0)
    env = dict(os.environ, DITTO_FAST_HOME=str(work / "home"), DITTO_FAST_CHECKPOINTS=str(ckpt),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    anchor = write_anchor_video(work / "anchor.mp4", 8, size=(1280, 720), face_px=120,
                                motion=Motion(center=(640, 360), velocity=(0.5, 0.0)))
    subprocess.run([sys.executable, "-m", "ditto_fast.cli", "register", str(anchor), "--name", "base", "--device",
                    "cpu", "--quiet"], env=env, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    x, sr = sf.read(REPO / "tests" / "data" / "speech_en_16k.wav", dtype="float32")
    clips = work / "clips"
    clips.mkdir()
    for i in range(JOBS):
        start = int((0.5 + 0.8 * i) * sr) % (len(x) - sr)
        sf.write(clips / f"clip{i}.wav", x[start:start + int((0.3 + 0.03 * i) * sr)], sr)
    return env, clips


def write_jobs(path: Path, clips: Path, out: Path) -> Path:
    """A JSON-lines file of the 10 jobs, outputs in `out`."""
    rows = [{"avatar": "base", "audio": str(clips / f"clip{i}.wav"), "output": str(out / f"clip{i}.mp4"), "seed": i}
            for i in range(JOBS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def batch(jobs: Path, report: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ditto_fast.cli", "batch", str(jobs), "--device", "cpu", "--quiet",
                             "--report", str(report)], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=Path("crash_report.json"))
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    work = args.work or Path(tempfile.mkdtemp(prefix="ditto-crash-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        env, clips = setup(work)
        ref_dir = work / "ref"
        ref_dir.mkdir()
        t0 = time.monotonic()
        p = batch(write_jobs(work / "ref.jsonl", clips, ref_dir), ref_dir / "report.json", env)
        first_s = None                    # when the first output appeared: the renders run from about then
        while p.poll() is None:
            if first_s is None and (ref_dir / "clip0.mp4").exists():
                first_s = time.monotonic() - t0
            time.sleep(0.05)
        _, err = p.communicate()
        clean_s = time.monotonic() - t0
        first_s = first_s or clean_s
        if p.returncode != 0:
            print(f"the clean run failed (exit {p.returncode}): {err.strip()[-500:]}")
            return 2
        ref = {f"clip{i}.mp4": decoded_frames(ref_dir / f"clip{i}.mp4") for i in range(JOBS)}
        out = work / "out"
        jobs = write_jobs(work / "jobs.jsonl", clips, out)
        rows = []
        for r in range(args.repeats):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            # a random point of the run, most of them while it renders and writes (start-up takes a while)
            delay = rng.uniform(0.0, first_s) if rng.random() < 0.2 else rng.uniform(0.8 * first_s, clean_s)
            p = batch(jobs, out / "report.json", env)
            time.sleep(delay)
            alive = p.poll() is None
            if alive:
                p.kill()                                  # SIGKILL, the Python process only
            p.communicate()
            done_at_kill = sum((out / f"clip{i}.mp4").exists() for i in range(JOBS))
            p = batch(jobs, out / "report.json", env)
            _, err = p.communicate()
            problems = [] if p.returncode == 0 else [f"rerun exit {p.returncode}: {err.strip()[-300:]}"]
            for name, (frames, digest) in ref.items():
                if not (out / name).exists():
                    problems.append(f"{name} missing")
                    continue
                got = decoded_frames(out / name)
                if got[0] != frames:
                    problems.append(f"{name}: {got[0]} frames, expected {frames}")
                elif got[1] != digest:
                    problems.append(f"{name}: frames differ from the clean run's")
            left = leftovers(out, work / "home")
            if left:
                problems.append(f"temporary files left: {left}")
            rows.append({"repeat": r, "kill_after_s": round(delay, 2), "killed_while_running": alive,
                         "outputs_done_at_kill": done_at_kill, "rerun_exit": p.returncode, "ok": not problems,
                         "problems": problems})
            print(f"repeat {r}: killed after {delay:5.1f} s ({done_at_kill}/{JOBS} done) -> "
                  f"{'ok' if not problems else '; '.join(problems)}", flush=True)
        ok = sum(row["ok"] for row in rows)
        killed = sum(row["killed_while_running"] for row in rows)
        result = {"repeats": args.repeats, "seed": args.seed, "clean_run_s": round(clean_s, 1),
                  "first_output_s": round(first_s, 1), "killed_mid_run": killed,
                  "verified": ok, "rows": rows}
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{ok}/{args.repeats} repeats verified ({killed} killed mid-run; clean run {clean_s:.1f} s): every "
              f"output present, right frame count, frames equal to the clean run's, no temporary file left"
              if ok == args.repeats else f"{args.repeats - ok}/{args.repeats} repeats FAILED; see {args.json}")
        return 0 if ok == args.repeats else 1
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
