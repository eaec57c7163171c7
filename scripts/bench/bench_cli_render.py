"""A whole `ditto-fast render` process as a user runs it (tiny networks, a 640x360 video avatar, 20 s of 44.1 kHz
stereo speech): process wall, the render's own wall, what is left (imports, checks, the avatar opened), and
how often and how long that process decoded the audio and hashed a file. $DITTO_FAST_BENCH_CHECKOUT points the processes at
another checkout (the code before a change) for a before/after comparison in one run."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, anchor, checkpoints, save

SECONDS = 20.0


def _speech_44k_stereo(seconds: float, path: Path) -> Path:
    import numpy as np
    import soundfile as sf

    x, sr = sf.read(REPO / "tests" / "data" / "speech_en_44k_stereo_2s.wav", dtype="float32")
    sf.write(path, np.resize(x, (int(seconds * sr), x.shape[1])), sr)
    return path


# the CLI in a child whose audio decoding and file hashing are timed (both arms: the digest's hash was a
# private helper before the render request, file_sha256 after)
TIMED_CLI = """
import json, sys, time
import ditto_fast.audio.decode as d
calls = {"decode": [], "hash": []}
def timed(key, fn):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            calls[key].append(time.perf_counter() - t)
    return run
d.load_audio = timed("decode", d.load_audio)
try:
    import ditto_fast.pipeline as old
    old.load_audio = d.load_audio
    old._file_sha256 = timed("hash", old._file_sha256)
except ImportError:
    d.file_sha256 = timed("hash", d.file_sha256)
from ditto_fast.cli import main
main(sys.argv[1:])
print(json.dumps(calls))
"""


def _cli(args: list[str], env: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", TIMED_CLI, *args], check=True, env=env, capture_output=True,
                         text=True).stdout
    return time.perf_counter() - t0, json.loads(out.strip().splitlines()[-1])


def run(out_json: str | None, quick: bool = False, tiny: bool = True) -> dict:
    """Three renders (one with quick) of the same clip in fresh processes; medians."""
    checkout = Path(os.environ.get("DITTO_FAST_BENCH_CHECKOUT", REPO))
    ckpt = checkpoints(True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "DITTO_FAST_HOME": str(tmp / "home"), "DITTO_FAST_CHECKPOINTS": str(ckpt),
               "PYTHONPATH": str(checkout), "DITTO_FAST_CPU_PRECISION": "fp32"}
        audio = _speech_44k_stereo(SECONDS, tmp / "speech.wav")
        subprocess.run([sys.executable, "-m", "ditto_fast.cli", "register", str(anchor(25, size=(640, 360))),
                        "--name", "b", "--quiet"], check=True, env=env, capture_output=True)
        rows = []
        for i in range(1 if quick else 3):
            prof = tmp / f"p{i}.json"
            wall, calls = _cli(["render", "--avatar", "b", "--audio", str(audio), "-o", str(tmp / f"o{i}.mp4"),
                         "--batch-size", "1", "--timings", str(prof), "--quiet"], env)
            p = json.loads(prof.read_text())
            rows.append({"process_s": wall, "render_s": p["wall_seconds"], "load_models_s": p["stages"]["load_models"],
                         "rest_s": wall - p["wall_seconds"] - p["stages"]["load_models"],
                         "decodes": len(calls["decode"]), "decode_s": sum(calls["decode"]),
                         "hashes": len(calls["hash"]), "hash_s": sum(calls["hash"])})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    result = {"checkout": str(checkout), "audio_seconds": SECONDS, "runs": rows, "median": med}
    print(f"`ditto-fast render`, tiny networks, 640x360, {SECONDS:g} s of 44.1 kHz stereo ({checkout}):")
    print(f"  process {med['process_s']:.2f} s = render {med['render_s']:.2f} + load_models {med['load_models_s']:.2f}"
          f" + the rest {med['rest_s']:.2f} (median of {len(rows)})")
    print(f"  the audio decoded {med['decodes']:.0f}x in {1000 * med['decode_s']:.0f} ms, files hashed "
          f"{med['hashes']:.0f}x in {1000 * med['hash_s']:.1f} ms")
    return save(out_json, result)
