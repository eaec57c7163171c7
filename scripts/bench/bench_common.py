"""Shared benchmark helpers: cached random checkpoints, synthetic anchors, subprocess peak RSS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "support"))   # synthetic media, reference code
CACHE = Path(os.environ.get("DITTO_FAST_BENCH_CACHE", REPO / "bench_out" / "cache"))


def checkpoints(tiny: bool, networks: tuple[str, ...] | None = None, hubert: bool = True) -> Path:
    """A cached random checkpoint root (full or tiny); written once per machine."""
    from ditto_fast.checkpoints import MODELS_SUBDIR
    from ditto_fast.checkpoints.random_weights import write_random
    from ditto_fast.models import NETWORK_NAMES, SPECS

    root = CACHE / ("ckpt_tiny" if tiny else "ckpt_full")
    wanted = networks or NETWORK_NAMES
    missing = tuple(n for n in wanted if not (root / MODELS_SUBDIR / SPECS[n].filename).is_file())
    need_hubert = hubert and not (root / "hubert-large-ls960-ft" / "vocab.json").is_file()    # (vocab: --script)
    if missing or need_hubert:
        write_random(root, tiny=tiny, seed=0, networks=missing, hubert=need_hubert, emotion=False)
    return root


def anchor(n_frames: int, size: tuple[int, int] = (1920, 1080), face_px: float = 220.0) -> Path:
    """A cached synthetic anchor video of n_frames at `size`."""
    from synthetic import Motion, write_anchor_video

    w, h = size
    path = CACHE / f"anchor_{n_frames}_{w}x{h}.mp4"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        motion = Motion(center=(w * 0.5, h * 0.5), velocity=(0.3, -0.05), spin_deg=0.02)
        write_anchor_video(path, n_frames, size=size, face_px=face_px * w / 1920, motion=motion)
    return path


def speech(seconds: float) -> Path:
    """A cached 16 kHz mono WAV of `seconds`, looping the committed speech sample (16-bit PCM: the standard
    library's wave reads and writes it, so a bare GPU image without soundfile makes it too)."""
    import wave

    import numpy as np

    path = CACHE / f"speech_{seconds:g}s.wav"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        with wave.open(str(REPO / "tests" / "data" / "speech_en_16k.wav"), "rb") as src:
            params, x = src.getparams(), np.frombuffer(src.readframes(src.getnframes()), "<i2")
        with wave.open(str(path), "wb") as dst:
            dst.setparams(params)
            dst.writeframes(np.resize(x, int(seconds * params.framerate * params.nchannels)).tobytes())
    return path


def run_child(code: str, env: dict | None = None) -> tuple[dict, float]:
    """Run python code in a child; returns (the JSON it prints on its last line, its peak RSS in MiB)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, cwd=REPO)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed with exit {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), usage.ru_maxrss / 1024.0


def save(out_json: str | None, result: dict) -> dict:
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def ms(seconds: float | None, width: int = 0) -> str:
    """A latency in ms (right-aligned in `width`), or 'none' where it was not measured (no frame made for its slot
    went out): never 0 ms."""
    return f"{'none' if seconds is None else f'{1000 * seconds:.0f} ms':>{width}}"
