"""Delivery profiles: each shipped profile's 10 s render (tiny networks) and its QC table, the per-frame cost of
each profile's encoder beside today's x264, the field-rate option's cost beside PsF, and loudness accuracy from
speech at -35, -23 and -10 LUFS (measured on the delivered file, as `qc` measures it)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

from bench_common import REPO, anchor, checkpoints, save, speech
from synthetic import patched_frames

INPUT_LUFS = (-35.0, -23.0, -10.0)
LOOP_STAGES = ("stitch", "render", "putback", "write")


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ditto_fast.cli", *args], capture_output=True, text=True, env=env,
                          cwd=REPO)


def _planes(n: int) -> list[np.ndarray]:
    """n distinct 1080p frames (the colour-patch picture, moving) as yuv420p planes, as a render feeds them."""
    from ditto_fast.media.yuv import rgb_to_i420

    return [rgb_to_i420(f) for f in patched_frames((1920, 1080), n)]


def _encode_cost(fmt, out: Path, planes: list[np.ndarray], frames: int) -> dict:
    """Wall and CPU (ffmpeg's, all threads) milliseconds per frame of writing `frames` 1080p frames."""
    from ditto_fast.encoding.writer import VideoWriter

    rate = getattr(fmt, "rate", 25)                 # a delivery's; today's formats leave it to the avatar
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with VideoWriter(out, (1920, 1080), fps=rate, fmt=fmt, pix_fmt="yuv420p") as w:
        for i in range(frames):
            w.write(planes[i % len(planes)])
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_ms_per_frame": 1000 * wall / frames, "cpu_ms_per_frame": 1000 * cpu / frames,
            "mb_per_s": out.stat().st_size / 1e6 / (frames / float(rate))}


def encoders(work: Path, frames: int) -> dict:
    """Each profile's encoder (and today's default x264) on the same 1080p frames, no audio."""
    from ditto_fast.delivery.format import DeliveryFormat
    from ditto_fast.encoding.formats import output_format
    from ditto_fast.delivery.profiles import load_profile, shipped_profiles

    planes = _planes(25)
    result = {"x264 (today's .mp4: veryfast, crf 18)": _encode_cost(output_format(work / "x.mp4"), work / "x.mp4",
                                                                     planes, frames)}
    for name in shipped_profiles():
        p = load_profile(name)
        fmt = DeliveryFormat(p, (1920, 1080), p.video.rate or Fraction(25))
        result[name] = _encode_cost(fmt, work / f"{name}{p.extension}", planes, frames)
    return result


def renders(work: Path, ckpt: Path, audio: Path, extra: dict[str, Path]) -> dict:
    """A 10 s CLI render per profile (tiny networks): its QC lines and the frame loop's cost per delivered frame."""
    from ditto_fast.delivery.profiles import load_profile, shipped_profiles

    env = dict(os.environ, DITTO_FAST_HOME=str(work / "home"), DITTO_FAST_CHECKPOINTS=str(ckpt))
    r = _cli(["register", str(anchor(50)), "--name", "a", "--quiet", "--force"], env)
    if r.returncode:
        raise RuntimeError(f"register failed: {r.stderr[-500:]}")
    result = {}
    for name, profile in [*((n, n) for n in shipped_profiles()), *((n, str(f)) for n, f in extra.items())]:
        out, prof = work / f"{name}{load_profile(profile).extension}", work / f"{name}.json"
        t0 = time.perf_counter()
        r = _cli(["render", "--avatar", "a", "--audio", str(audio), "-o", str(out), "--delivery", profile, "--quiet",
                  "--timings", str(prof)], env)
        seconds = time.perf_counter() - t0
        if r.returncode:
            raise RuntimeError(f"render {name} failed: {r.stderr[-500:]}")
        stages = json.loads(prof.read_text())
        qc = json.loads(_cli(["qc", str(out), "--delivery", profile, "--json"], env).stdout)
        rendered = stages["frames"]
        delivered = round(rendered * Fraction(stages["delivery"]["delivered_rate"]) / Fraction(stages["rate"]))
        loop = sum(stages["stages"].get(k, 0) for k in LOOP_STAGES)
        result[name] = {"rendered_frames": rendered, "delivered_frames": delivered, "render_s": seconds,
                        "loop_ms_per_delivered_frame": 1000 * loop / delivered,
                        "stages_ms_per_rendered_frame": {k: 1000 * stages["stages"].get(k, 0) / rendered
                                                         for k in LOOP_STAGES},
                        "delivered_rate": stages["delivery"]["delivered_rate"],
                        "qc": qc["requirements"], "ok": qc["ok"], "loudness": stages["delivery"].get("loudness")}
    return result


def loudness(work: Path, audio: Path, frames: int) -> dict:
    """Speech scaled to each input loudness, leveled and written as each leveling profile delivers it (the engine's
    writer and gain), then measured on the file as `qc` does: output loudness and true peak against the target."""
    from ditto_fast.audio.loudness import measure
    from ditto_fast.delivery.leveling import level
    from ditto_fast.delivery.format import DeliveryFormat, measured_as, programme_chain
    from ditto_fast.delivery.profiles import load_profile, shipped_profiles
    from ditto_fast.delivery.qc import check_file
    from ditto_fast.encoding.writer import VideoWriter

    x, sr = sf.read(audio, dtype="float32")
    base = measure(audio, "[0:a:0]anull").integrated
    planes = _planes(1)
    result: dict = {}
    for lufs in INPUT_LUFS:
        wav = work / f"speech_{lufs:g}.wav"
        sf.write(wav, x * np.float32(10 ** ((lufs - base) / 20)), sr, subtype="FLOAT")
        got_in = measure(wav, "[0:a:0]anull")
        for name in shipped_profiles():
            p = load_profile(name)
            if p.loudness is None:
                continue
            lev = level(wav, programme_chain(p), measured_as(p), *p.loudness)
            fmt = DeliveryFormat(p, (1920, 1080), p.video.rate or Fraction(25), gain=lev.filters)
            out = work / f"l{lufs:g}-{name}{p.extension}"
            with VideoWriter(out, (1920, 1080), fps=fmt.rate, audio_path=wav, fmt=fmt, pix_fmt="yuv420p",
                             frames=frames) as w:
                for _ in range(frames):
                    w.write(planes[0])
            req = {r.name: r for r in check_file(out, p)}
            target, ceiling = p.loudness
            result.setdefault(f"{lufs:g}", {})[name] = {
                "input_lufs": got_in.integrated, "input_true_peak": got_in.true_peak, "target": target,
                "ceiling": ceiling, "output": req["loudness"].measured, "true_peak": req["true peak"].measured,
                "limited": lev.limited, "ok": req["loudness"].ok and req["true peak"].ok}
    return result


def run(out_json: str | None, quick: bool = False) -> dict:
    """Encoders, 10 s renders per profile with their QC, field-rate vs PsF, loudness accuracy; prints the tables."""
    from ditto_fast.core.config import CONFIG_DIR

    seconds = 2.0 if quick else 10.0
    ckpt, audio = checkpoints(tiny=True), speech(seconds)
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        data = yaml.safe_load((CONFIG_DIR / "delivery" / "xdcam-hd422-1080i50.yaml").read_text())
        data["video"]["fields"] = "field-rate"
        fields = work / "xdcam-hd422-1080i50-field-rate.yaml"
        fields.write_text(yaml.safe_dump(data))
        result = {"networks": "tiny", "seconds": seconds, "encoders": encoders(work, 50 if quick else 250),
                  "renders": renders(work, ckpt, audio, {fields.stem: fields}),
                  "loudness": loudness(work, audio, int(seconds * 25))}
    print(f"\n{'encoder, 1080p frames':40} {'wall ms/f':>9} {'cpu ms/f':>9} {'MB/s':>7}")
    for name, e in result["encoders"].items():
        print(f"{name:40} {e['wall_ms_per_frame']:9.1f} {e['cpu_ms_per_frame']:9.1f} {e['mb_per_s']:7.2f}")
    print(f"\n{'render, 10 s, tiny networks':40} {'frames':>6} {'loop ms/delivered':>17} {'write':>6} {'QC':>6}")
    for name, r in result["renders"].items():
        ok = sum(q["ok"] for q in r["qc"])
        print(f"{name:40} {r['rendered_frames']:6d} {r['loop_ms_per_delivered_frame']:17.1f} "
              f"{r['stages_ms_per_rendered_frame']['write']:6.1f} {ok:>3}/{len(r['qc'])}")
        for q in r["qc"]:
            print(f"    {'ok' if q['ok'] else 'FAIL':5}{q['name']:16}{q['measured']}")
    print(f"\n{'loudness: input LUFS -> profile':44} {'target':>7} {'output':>12} {'true peak':>11} limited")
    for lufs, per in result["loudness"].items():
        for name, r in per.items():
            print(f"{r['input_lufs']:6.1f} -> {name:34} {r['target']:7.1f} {r['output']:>12} {r['true_peak']:>11} "
                  f"{'yes' if r['limited'] else 'no'}")
    return save(out_json, result)
