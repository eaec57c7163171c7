#!/usr/bin/env python
"""The prepared GPU check, on a bare GPU machine with its own Python and torch (no registry, no ffmpeg, no
mediapipe), from the bundle scripts/gpu/gpu_bundle.py builds:

    bash scripts/gpu_check.sh [--seconds 10] [--out bench_out/gpu_check.json]        # in the bundle
    bash scripts/gpu_check.sh --device cpu --tiny                                     # a dry run on a CPU

It writes random checkpoints there (`ditto-fast checkpoints init-random`, full size), opens the carried
1920x1080 image avatar, and prints: fp16 against fp32 warp + decode (PSNR); warp + decode ms/frame at batch
1/4/8/16; a 1080p end-to-end render's fps and each stage's ms/frame with look-ahead on and off, x264 and
NVENC; peak GPU memory; and writes it all as JSON. On a CPU (`--device cpu`) bf16 stands in for fp16.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "bundle"
sys.path[:0] = [str(ROOT), str(ROOT / "scripts" / "bench")]      # ditto_fast; bench_common (its speech)
SIZES = (1, 4, 8, 16)


def use_bundle(tmp: Path) -> list[str]:
    """The carried packages after the machine's own (theirs win) and the carried ffmpeg; what was used."""
    used = []
    if (BUNDLE / "site").is_dir():
        sys.path.append(str(BUNDLE / "site"))
        used.append("site")
    if "IMAGEIO_FFMPEG_EXE" not in os.environ and (BUNDLE / "ffmpeg.xz").is_file():
        exe = tmp / "ffmpeg"
        with lzma.open(BUNDLE / "ffmpeg.xz") as src, open(exe, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        exe.chmod(0o755)
        os.environ["IMAGEIO_FFMPEG_EXE"] = str(exe)
        used.append("ffmpeg.xz")
    return used


def missing_modules() -> list[str]:
    """The render's modules that this Python cannot import."""
    import importlib.util

    names = ("torch", "numpy", "cv2", "transformers", "safetensors", "soxr", "yaml", "click", "tqdm",
             "imageio_ffmpeg", "threadpoolctl")
    return [n for n in names if importlib.util.find_spec(n) is None]


def init_checkpoints(root: Path, tiny: bool) -> float:
    """`ditto-fast checkpoints init-random ROOT` in a child process (as a user would); its seconds."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
    subprocess.run([sys.executable, "-m", "ditto_fast.cli", "checkpoints", "init-random", str(root),
                    *(["--tiny"] if tiny else []), "--seed", "0"], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def open_avatar(ckpt: Path, size: str, home: Path) -> str:
    """Copy the carried avatar into the store at `home`; when torch wrote these checkpoint files differently
    from the bundle's (same weights, other container bytes), rebind its fingerprints after checking that the
    extractors' tensors are the ones it was made with. Returns what was done."""
    from ditto_fast.avatar.format import PKL_NAME, encode_pkl, read_pkl
    from ditto_fast.checkpoints import MODELS_SUBDIR, find_checkpoints
    from ditto_fast.models import SPECS
    from gpu_bundle import weights_digest

    dest = home / "avatars" / "gpu_check"
    shutil.copytree(BUNDLE / "avatars" / size, dest)
    body = read_pkl("gpu_check", dest)
    now = find_checkpoints(ckpt).avatar_fingerprints()
    if body["fingerprints"] == now:
        return "fingerprints match"
    made_with = json.loads((BUNDLE / "manifest.json").read_text())["avatar_weights"][size]
    here = {n: weights_digest(ckpt / MODELS_SUBDIR / SPECS[n].filename) for n in made_with}
    if here != made_with:
        raise SystemExit(f"gpu_check: {ckpt}: init-random wrote other extractor weights than the bundle's avatar "
                         f"was made with ({here} vs {made_with}); rebuild the bundle with this torch")
    body["fingerprints"] = now
    (dest / PKL_NAME).write_bytes(encode_pkl(body))
    return "fingerprints rebound (same extractor tensors, other torch.save bytes)"


def parity(files: dict[str, Path], device: "torch.device") -> dict:
    """Half precision against fp32 for one warp + decode batch: PSNR of the crops."""
    import torch

    from ditto_fast.render.fused import FusedRenderer
    from ditto_fast.engine.precision import psnr
    from ditto_fast.engine.measurements import sample_inputs

    half = torch.float16 if device.type == "cuda" else torch.bfloat16
    crops = {}
    for dtype in (torch.float32, half):
        fused = FusedRenderer(files["warp_network"], files["decoder"], device, dtype)
        crops[dtype] = fused(*sample_inputs(fused, 4))
        del fused
    return {"half": str(half).replace("torch.", ""), "psnr_db": round(psnr(crops[torch.float32], crops[half]), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny networks (the CPU dry run)")
    ap.add_argument("--seconds", type=float, default=None, help="speech per render (default 10; 1 with --tiny)")
    ap.add_argument("--out", type=Path, default=Path("bench_out/gpu_check.json"))
    args = ap.parse_args(argv)
    seconds = args.seconds or (1.0 if args.tiny else 10.0)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    try:
        return run(args, seconds, tmp, t_start)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, seconds: float, tmp: Path, t_start: float) -> int:
    """The check itself (main() owns the scratch folder)."""
    used = use_bundle(tmp)
    missing = missing_modules()
    if missing:
        print(f"gpu_check: this Python ({sys.executable}) lacks {', '.join(missing)}; install them or carry them "
              "in bundle/site (scripts/gpu/gpu_bundle.py)", file=sys.stderr)
        return 2
    home = tmp / "home"
    os.environ["DITTO_FAST_HOME"] = str(home)
    import cv2
    import numpy as np
    import torch
    import transformers

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (a dry run: --device cpu --tiny)", file=sys.stderr)
        return 2
    cuda = device.type == "cuda"
    from bench_common import speech
    from ditto_fast.checkpoints import find_checkpoints
    from ditto_fast.engine.renderer import STAGES, Renderer
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.engine.batch_size import measure
    from ditto_fast.encoding.formats import nvenc_works

    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    out = {"device": name, "tiny": args.tiny, "bundle": used,
           "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
                        "numpy": np.__version__, "transformers": transformers.__version__, "opencv": cv2.__version__}}
    print(f"{name}; " + ", ".join(f"{k} {v}" for k, v in out["versions"].items()) + f"; carried: {', '.join(used)}")
    ckpt = tmp / "checkpoints"
    out["init_random_s"] = round(init_checkpoints(ckpt, args.tiny), 1)
    out["avatar"] = open_avatar(ckpt, "tiny" if args.tiny else "full", home)
    print(f"checkpoints init-random ({'tiny' if args.tiny else 'full size'}) {out['init_random_s']} s; "
          f"avatar: {out['avatar']}", flush=True)
    cs = find_checkpoints(ckpt)

    out["parity"] = parity(cs.files, device)
    print(f"{out['parity']['half']} vs fp32 warp + decode: PSNR {out['parity']['psnr_db']} dB", flush=True)
    dtype = torch.float16 if cuda else torch.float32
    rows = measure(cs.files["warp_network"], cs.files["decoder"], device, dtype, SIZES, 32 if cuda else 1)
    out["batches"] = rows
    print("warp + decode ms/frame: " + ", ".join(f"batch {r['batch']} {r['ms_per_frame']:.2f}" for r in rows),
          flush=True)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    nvenc, why = nvenc_works("h264")
    out["nvenc"] = nvenc if nvenc else f"does not work: {why}"
    engine = Renderer(ckpt, device=args.device, precision="fp16" if cuda else "fp32")
    base_setup, base_cfg = engine.setup, engine.config
    audio = speech(seconds)
    if cuda:
        engine.render(RenderRequest("gpu_check", speech(1.0), tmp / "warmup.mp4"))  # kernels chosen, memory laid out
    shown = [k for k in STAGES if k not in ("load_models", "load_avatar")]
    print(f"1080p render of {seconds:g} s ({base_setup.batch_choice}):\n"
          f"{'ahead':>5} {'encoder':>11} {'fps':>7} " + " ".join(f"{k[:9]:>9}" for k in shown), flush=True)
    renders = []
    for use_nvenc in ([False, True] if nvenc else [False]):
        for ahead in (False, True):
            engine.setup = dataclasses.replace(base_setup, nvenc=use_nvenc)
            engine.config = dataclasses.replace(base_cfg, render=dataclasses.replace(base_cfg.render, lookahead=ahead))
            res = engine.render(RenderRequest("gpu_check", audio, tmp / f"out_{ahead}_{use_nvenc}.mp4"))
            p = res.timings
            per = {k: round(1000 * p["stages"][k] / p["frames"], 2) for k in shown}
            renders.append({"lookahead": ahead, "encoder": p["encoder"], "frames": p["frames"],
                            "fps": round(p["fps"], 2), "ms_per_frame": per})
            print(f"{str(ahead):>5} {p['encoder']:>11} {p['fps']:7.1f} " + " ".join(f"{per[k]:9.1f}" for k in shown),
                  flush=True)
    out["renders"] = renders
    out["engine_process"] = engine_process(engine, base_setup, audio, tmp, renders)
    engine.setup, engine.config = base_setup, base_cfg
    out["live"] = [live_loop(engine, audio, tmp, overlap, steps) for overlap, steps in ((70, 25), (70, 10), (75, 10))]
    out["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device) if cuda else 0
    out["seconds"] = round(time.perf_counter() - t_start, 1)
    print(f"peak GPU memory {out['peak_gpu_bytes'] / 2**30:.2f} GiB; whole check {out['seconds']:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def live_loop(engine, audio: Path, tmp: Path, overlap: int, steps: int) -> dict:
    """`ditto-fast live` in this process: the speech file at its own pace into the online loop, the 1080p avatar, a
    .ts stream out (x264); the session's stats and what each stage leaves of a frame's 40 ms at 25 fps."""
    from fractions import Fraction

    from ditto_fast.live.outputs import StreamOutput
    from ditto_fast.live.session import LiveSession, LiveSettings
    from ditto_fast.live.sources import open_source
    from ditto_fast.motion.conditions import emotion_vector

    avatar = engine.avatar("gpu_check")
    settings = LiveSettings(emotion=emotion_vector("neutral"), seed=0, steps=steps, codec="h264",
                            overlap=overlap, rate=Fraction(25), blend=engine.config.render.blend, controls=None,
                            max_latency=3.0, stop_at_end=True)
    output = StreamOutput(str(tmp / f"live_{overlap}_{steps}.ts"), avatar.size, settings.rate, "yuv420p",
                          crf=engine.setup.crf, preset=engine.setup.preset, encoder="libx264")
    s = LiveSession(engine, avatar, open_source(str(audio)), output, settings).run()
    per = s["ms_per_frame"]
    motion_ms = 1000 * (s["rtf"]["audio_features"] + s["rtf"]["motion"]) / 25
    s["budget_left_ms"] = {"frames thread": round(40 - per["stitch"] - per["render"] - per["handoff"], 1),
                           "output thread": round(40 - per["putback"] - per["write"], 1),
                           "motion thread": round(40 - motion_ms, 1)}
    f, lat = s["frames"], s["latency_s"] or {}
    print(f"live 1080p25, overlap {overlap}, {steps} steps: first frame {1000 * (s['first_frame_latency_s'] or 0):.0f} ms, latency "
          f"median {1000 * lat.get('median', 0):.0f} ms; {f['sent']} frames, {f['on_time']} on time, {f['repeated']} "
          f"repeated; RTF " + ", ".join(f"{k} {v:.3f}" for k, v in s["rtf"].items() if v is not None)
          + "; of 40 ms a frame left: " + ", ".join(f"{k} {v} ms" for k, v in s["budget_left_ms"].items()), flush=True)
    return {"overlap": overlap, "steps": steps, **s}


def engine_process(engine, setup, audio: Path, tmp: Path, renders: list[dict]) -> dict:
    """The same render through an engine process (ditto_fast/handles: how serve and batch render): its start, fps,
    and whether its bytes are the in-process render's (x264, the config's look-ahead)."""
    from ditto_fast.engine.clip import check_clip
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.handles.base import EngineJob
    from ditto_fast.handles.process import ProcessEngine

    if (BUNDLE / "site").is_dir():          # the child finds the carried packages too
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(BUNDLE / "site")]))
    handle = ProcessEngine(dataclasses.replace(setup, nvenc=False), name="gpu-check")
    t0 = time.perf_counter()
    try:
        handle.start()
        start_s = time.perf_counter() - t0
        request = RenderRequest("gpu_check", audio, tmp / "out_process.mp4")
        clip = check_clip(request, engine.avatar("gpu_check"), setup.config)
        res = handle.render(EngineJob(request, clip.audio))
    except Exception as e:  # noqa: BLE001 - said in the figures, the rest of the check stands
        print(f"engine process: {type(e).__name__}: {e}", flush=True)
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        handle.close()
    ahead = setup.config.render.lookahead
    same = (tmp / "out_process.mp4").read_bytes() == (tmp / f"out_{ahead}_False.mp4").read_bytes()
    fps_here = next(r["fps"] for r in renders if r["lookahead"] == ahead and r["encoder"] == res.timings["encoder"])
    row = {"start_s": round(start_s, 2), "fps": round(res.timings["fps"], 2), "fps_in_process": fps_here,
           "same_bytes_as_in_process": same}
    print(f"engine process: started in {row['start_s']} s, {row['fps']} fps (in process {fps_here}); "
          f"same bytes: {same}", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
