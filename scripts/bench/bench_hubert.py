"""Benchmark HuBERT features: batched windows vs Ditto's one window per call, full-size random HuBERT.

    python scripts/bench/bench_hubert.py [--quick] [--seconds 60] [--model-dir DIR] [--json OUT]
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from ditto_fast.audio.decode import frame_count, load_audio
from ditto_fast.audio.hubert import WINDOW, HubertFeatures, pad_signal, window_starts
from ditto_fast.checkpoints.random_hubert import write_random_hubert
from reference import hubert_encode_windows

SPEECH = Path("/work/shared/media/news_en_16k.wav")


def _cache_dir() -> Path:
    home = Path(os.environ.get("DITTO_FAST_HOME", "~/.cache/ditto-fast")).expanduser()
    return home / "bench" / "hubert_random_large_seed0"


def _speech(seconds: float) -> tuple[np.ndarray, str]:
    """`seconds` of 16 kHz speech: the shared news clip looped, else a synthetic voiced signal."""
    n = int(round(seconds * 16000))
    if SPEECH.exists():
        clip = load_audio(SPEECH)
        return np.resize(clip, n).astype(np.float32), f"{SPEECH.name} looped"
    rng = np.random.default_rng(0)
    t = np.arange(n) / 16000
    pitch = 120 + 30 * np.sin(2 * np.pi * 0.5 * t)
    voiced = np.sin(2 * np.pi * np.cumsum(pitch) / 16000) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)) ** 2
    return (0.3 * voiced + 0.02 * rng.standard_normal(n)).astype(np.float32), "synthetic"


def _interleaved(hf: HubertFeatures, audio: np.ndarray) -> dict:
    """Time the three ways per batch-sized group of windows, back to back in rotating order.

    On a shared, busy CPU the load drifts over minutes; timing the modes on the same group one
    right after the other keeps that drift out of the ratio.
    """
    n_frames = frame_count(audio.shape[0])
    padded, starts = pad_signal(audio), window_starts(n_frames)
    modes = {
        "one_by_one": lambda st: np.stack([hubert_encode_windows(hf, padded[None, s:s + WINDOW])[0] for s in st]),
        "batched_plain": lambda st: hubert_encode_windows(hf, padded[st[:, None] + np.arange(WINDOW)]),
        "batched": lambda st: hf._encode_batch(padded, st),
    }
    names = list(modes)
    seconds = {m: 0.0 for m in names}
    outs: dict[str, list] = {m: [] for m in names}
    ratios = []
    for g, b0 in enumerate(range(0, len(starts), hf.batch_size)):
        st = starts[b0:b0 + hf.batch_size]
        took = {}
        for m in names[g % 3:] + names[:g % 3]:
            t0 = time.perf_counter()
            outs[m].append(modes[m](st))  # [B, 5, hidden]
            took[m] = time.perf_counter() - t0
            seconds[m] += took[m]
        ratios.append(took["one_by_one"] / took["batched"])
    feats = {m: np.concatenate(outs[m]).reshape(-1, hf.hidden_size)[:n_frames] for m in names}
    return {"seconds": seconds, "feats": feats, "median_group_speedup": float(np.median(ratios)),
            "windows": len(starts)}


def run(out_json: str | None, quick: bool = False, seconds: float = 60.0, model_dir: str | None = None,
        batch_size: int | None = None, threads: int | None = None) -> dict:
    """Time batched vs one-window-at-a-time HuBERT features; print a table; return (and save) a dict."""
    if threads:
        torch.set_num_threads(int(threads))
    seconds = 10.0 if quick else float(seconds)
    if model_dir is None:
        model_dir = _cache_dir()
        if not (Path(model_dir) / "model.safetensors").exists():
            write_random_hubert(model_dir, tiny=False, seed=0)
    hf = HubertFeatures(model_dir, device="cpu", batch_size=batch_size)
    audio, source = _speech(seconds)
    hf.features(audio[:16000])  # warm-up
    r = _interleaved(hf, audio)
    t, f = r["seconds"], r["feats"]
    public = hf.features(audio)  # the public batched call gives the same rows
    result = {
        "audio_seconds": seconds,
        "audio_source": source,
        "frames": int(f["batched"].shape[0]),
        "windows": r["windows"],
        "hidden": int(f["batched"].shape[1]),
        "batch_size": hf.batch_size,
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "seconds_one_by_one": t["one_by_one"],
        "seconds_batched_plain": t["batched_plain"],
        "seconds_batched": t["batched"],
        "speedup_batched": t["one_by_one"] / t["batched"],
        "speedup_batched_plain": t["one_by_one"] / t["batched_plain"],
        "median_group_speedup": r["median_group_speedup"],
        "realtime_factor_batched": seconds / t["batched"],
        "max_abs_diff": float(np.abs(f["batched"] - f["one_by_one"]).max()),
        "max_abs_diff_plain": float(np.abs(f["batched_plain"] - f["one_by_one"]).max()),
        "max_abs_diff_public": float(np.abs(public - f["batched"]).max()),
        "max_abs_feature": float(np.abs(f["one_by_one"]).max()),
        "model_dir": str(model_dir),
    }
    rows = [("one window per call", t["one_by_one"], 1.0, 0.0),
            (f"batched x{hf.batch_size}, whole model", t["batched_plain"], result["speedup_batched_plain"],
             result["max_abs_diff_plain"]),
            (f"batched x{hf.batch_size}, shared front end", t["batched"], result["speedup_batched"],
             result["max_abs_diff"])]
    print(f"HuBERT features, {seconds:.0f} s of audio ({source}), {r['windows']} windows -> "
          f"[{result['frames']}, {result['hidden']}], {result['torch_threads']} torch threads")
    print(f"{'mode':<36}{'seconds':>10}{'speedup':>10}{'max|diff|':>12}")
    for name, secs, sp, diff in rows:
        print(f"{name:<36}{secs:>10.2f}{sp:>9.2f}x{diff:>12.2e}")
    print(f"median per-group speedup (shared front end): {result['median_group_speedup']:.2f}x; "
          f"batched runs at {result['realtime_factor_batched']:.2f}x real time")
    if out_json:
        Path(out_json).write_text(json.dumps(result, indent=2) + "\n")
    return result
