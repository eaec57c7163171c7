#!/usr/bin/env python
"""The prepared GPU check, on a bare GPU machine with its own Python and torch (no registry, no ffmpeg, no
mediapipe), from the bundle scripts/gpu/gpu_bundle.py builds:

    bash scripts/gpu_check.sh [--seconds 10] [--budget 480] [--out bench_out/gpu_check.json]   # in the bundle
    bash scripts/gpu_check.sh --device cpu --tiny                                              # a dry run on a CPU

It writes random checkpoints there (`ditto-fast checkpoints init-random`, full size), opens the carried
1920x1080 image avatar, and measures, within the budget (8 minutes; what does not fit is skipped and said so):
  - fp16 against fp32 warp + decode (PSNR); warp + decode ms/frame at batch 1/4/8/16 (the batch-size probe)
  - registration's share on the device: the extractors' ms a frame at register's batch
  - each `launch` on its own: warp + decode ms/frame at batch 1 and the engine's batch, and the LMDM's DDIM step
    (ms a step at batch 1, as a render and a live session run it), eager against CUDA graphs
  - a 1080p end-to-end render of `--seconds` of speech in this process for each arm of output stage (inline,
    thread) x launch (eager, graphs), alternating, each repeated: fps, each stage's ms/frame, and whether its
    bytes are the baseline's (inline, eager)
  - the same render through engine processes (ditto_fast/handles: how serve and batch render), for the baseline
    and for the both-switches-on arm: its start, its first and second job (cold and warm), fps against in process
  - live 1080p25 (the speech file at its own pace): 25 steps eager and with graphs at overlap 70, graphed at 75 and
    78, and the 10 steps of the first run: first-frame latency, frames on time
  - sessions: 1, 2, 4, then 6 and 8 live sessions at once on one engine (1080p25, 25 steps, graphs), sharing its
    warp + decode and its DDIM sampler as an engine process's sessions do, while every session holds 95 % on time:
    the worst session's share of frames on time, the slowest first frame, captures made while they streamed
  - the encoder on its own (x264 threads: auto against counts sized to the host) and NVENC (the carried ffmpeg's
    and the machine's own, where it has one)
  - last, what time is left: torch.compile (launch compile) in an engine process that is killed at the budget
and writes it all as JSON. On a CPU (`--device cpu`) bf16 stands in for fp16 and the graphs arms run through the
CPU's stand-in for a graph (core/graphs.py Rerun): the bookkeeping and the bytes, not the speed.
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
from bench_common import ms  # noqa: E402  (the standard library only: importable before the bundle's packages)
SIZES = (1, 4, 8, 16)


def use_bundle(tmp: Path) -> list[str]:
    """The carried packages after the machine's own (theirs win) and the carried ffmpeg; what was used. The engine
    processes get the carried packages this machine lacks, and only those (CHILD_SITE): on PYTHONPATH they would
    come before its own."""
    used = []
    if (BUNDLE / "site").is_dir():
        lacking(BUNDLE / "site", tmp / "child_site")
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


def lacking(site: Path, dest: Path) -> None:
    """Links in `dest` to the entries of the carried `site` whose module this Python cannot import by itself (with
    their dist-info)."""
    import importlib.util

    dest.mkdir(parents=True, exist_ok=True)
    for entry in site.iterdir():
        name = entry.name.split("-")[0] if entry.name.endswith(".dist-info") else entry.name.removesuffix(".py")
        if name != "__pycache__" and importlib.util.find_spec(name) is None:
            (dest / entry.name).symlink_to(entry)


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


ARMS = (("inline", "eager"), ("thread", "eager"), ("inline", "graphs"), ("thread", "graphs"))
# overlap, steps, launch: the default eager and graphed, shorter windows graphed (overlap 78: the nearest to a first
# frame in 0.4 s: docs/performance.md), and the 10 steps eager that kept up on the H200
SESSIONS = (1, 2, 4, 6, 8)      # live sessions at once on one engine (a CPU's dry run: the first two)
LIVE = ((70, 25, "eager"), (70, 25, "graphs"), (75, 25, "graphs"), (78, 25, "graphs"), (70, 10, "eager"))
COMPILE_AT_LEAST_S = 150        # what the compile arm needs of the budget to be tried at all


class Budget:
    """The check's time: `left()` seconds of `seconds` from `start`; `fits(s, what)` says whether `s` more fit, and
    prints what is skipped when not."""

    def __init__(self, seconds: float, start: float):
        self.seconds, self.start, self.skipped = seconds, start, []

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def fits(self, needs: float, what: str) -> bool:
        if self.left() >= needs:
            return True
        self.skipped.append(what)
        print(f"skipped (about {needs:.0f} s needed, {max(0.0, self.left()):.0f} s of the budget left): {what}",
              flush=True)
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny networks (the CPU dry run)")
    ap.add_argument("--seconds", type=float, default=None, help="speech per render (default 10; 1 with --tiny)")
    ap.add_argument("--repeats", type=int, default=None, help="timed renders per arm (default 2; 1 with --tiny)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds the whole check may take (default 480; 1800 with --tiny: a dry run runs every arm)")
    ap.add_argument("--out", type=Path, default=Path("bench_out/gpu_check.json"))
    args = ap.parse_args(argv)
    seconds = args.seconds or (1.0 if args.tiny else 10.0)
    repeats = args.repeats or (1 if args.tiny else 2)
    args.budget = args.budget or (1800.0 if args.tiny else 480.0)
    budget = Budget(args.budget, time.perf_counter())
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    try:
        return run(args, seconds, repeats, tmp, budget)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, seconds: float, repeats: int, tmp: Path, budget: Budget) -> int:
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
    if args.tiny and not cuda:      # tiny networks run fastest on one thread, here and in the engine processes
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
    from bench_common import speech
    from ditto_fast.checkpoints import find_checkpoints
    from ditto_fast.core.memory import reuse_freed_memory
    from ditto_fast.engine.renderer import Renderer
    from ditto_fast.engine.batch_size import measure
    from ditto_fast.encoding.formats import nvenc_works

    reuse_freed_memory()        # the malloc policy of `render`, `batch` and every engine process: alike on both sides
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    out = {"device": name, "tiny": args.tiny, "bundle": used, "cpus": os.cpu_count(), "budget_s": args.budget,
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

    out["register_extractors"] = register_extractors(cs.files, device, cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    engine = Renderer(ckpt, device=args.device, precision="fp16" if cuda else "fp32", encoder="software")
    out["engine_load_s"] = round(time.perf_counter() - t0, 2)       # with the warm-up on CUDA
    arms = Arms(engine, cuda)
    out["launch"] = launch_timings(engine, arms, cuda)
    audio = speech(seconds)
    out["renders"] = render_arms(engine, arms, audio, speech(1.0), tmp, repeats)
    out["engine_process"] = [row for arm in (ARMS[0], ARMS[-1])
                             if (row := engine_process(engine.setup, arm, audio, tmp, out["renders"], budget))]
    out["live"] = [row for overlap, steps, launch in LIVE
                   if (row := live_loop(engine, arms, audio, tmp, overlap, steps, launch, budget))]
    out["sessions"] = sessions_arm(engine, audio, tmp, budget, cuda)
    out["encoders"] = encoder_arms(tmp / "arm_inline_eager.mp4", engine.setup, budget)
    out["nvenc"] = nvenc(engine, arms, audio, tmp, nvenc_works, budget)
    out["compile"] = compile_arm(engine.setup, audio, tmp, out["renders"], budget) if cuda else \
        "not tried on a CPU (minutes to compile even the tiny networks)"
    out["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device) if cuda else 0
    out["skipped"] = budget.skipped
    out["seconds"] = round(time.perf_counter() - budget.start, 1)
    print(f"peak GPU memory {out['peak_gpu_bytes'] / 2**30:.2f} GiB; whole check {out['seconds']:.0f} s"
          + (f"; skipped: {'; '.join(budget.skipped)}" if budget.skipped else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def register_extractors(files: dict[str, Path], device, cuda: bool, batches: int = 6) -> dict:
    """Registration's share on the device, as `register` runs it: the appearance and motion extractors on batches of
    256x256 crops (register.batch_size, fp32), each batch's features back to the host as float16; ms a frame after a
    warm-up batch. The rest of registration (decoding, mediapipe's landmarks, the crops, the cache) is the CPU's and
    mediapipe is not on a bare GPU image: `benchmark.py register` measures it on a set-up machine."""
    import numpy as np
    import torch

    from ditto_fast.avatar.register import Extractors
    from ditto_fast.core.config import load_config

    batch = load_config().register.batch_size
    nets = Extractors(files, device)
    crops = np.random.default_rng(0).integers(0, 256, (batch, 256, 256, 3), dtype=np.uint8)
    rows = None
    for k in range(batches + 1):                 # the first is the warm-up
        if k == 1:
            t0 = time.perf_counter()
        f_s, _ = nets(crops)
        if rows is None:
            rows = torch.empty(f_s.shape, dtype=torch.float16)
        rows.copy_(f_s)
    ms = 1000 * (time.perf_counter() - t0) / (batches * batch)
    del nets
    if cuda:
        torch.cuda.empty_cache()
    print(f"registration's extractors: {ms:.2f} ms a frame at batch {batch}", flush=True)
    return {"batch": batch, "ms_per_frame": round(ms, 3)}


class Arms:
    """The engine's launchers per `launch` (warp + decode and the DDIM step), made once each and kept, so a later
    render or session of the same arm replays what the first captured. On a CPU the graphs arm runs through the
    stand-in for a graph (core/graphs.py Rerun), as the bookkeeping's tests do: the same path, the same bytes."""

    def __init__(self, engine, cuda: bool):
        self.engine, self.cuda = engine, cuda
        self.base = (engine.fused, engine.denoise, engine.setup)
        self._made: dict[str, tuple] = {engine.setup.launch: (engine.fused, engine.denoise)}

    def launchers(self, launch: str) -> tuple:
        """(FusedRenderer, Denoiser) launched as `launch` says."""
        from ditto_fast.core.graphs import Launched
        from ditto_fast.motion.ddim import Denoiser

        if launch not in self._made:
            fused, denoise = self.base[0].twin(launch=launch), Denoiser(self.engine.lmdm, launch)
            if launch == "graphs" and not self.cuda:
                fused._launched = Launched(fused._warp_decode, cuda=False)
                denoise._launched = Launched(denoise._flat, cuda=False, skip_unchanged=True)
            self._made[launch] = (fused, denoise)
        return self._made[launch]

    def use(self, output_stage: str, launch: str, **setup) -> None:
        """The engine set to this arm (its setup's output stage and launch, and the launchers made for it)."""
        import dataclasses

        self.engine.fused, self.engine.denoise = self.launchers(launch)
        self.engine.setup = dataclasses.replace(self.base[2], output_stage=output_stage, launch=launch, **setup)

    def counts(self, launch: str) -> dict:
        """What the arm's launchers did so far (eager calls, captures, replays), where they keep count."""
        fused, denoise = self.launchers(launch)
        return {k: dict(getattr(x._launched, "counts", {})) for k, x in (("warp_decode", fused), ("ddim", denoise))
                if x._launched is not None}


def launch_timings(engine, arms: Arms, cuda: bool) -> list[dict]:
    """Each launch on its own: warp + decode ms/frame at batch 1 and at the engine's batch, as the render loop runs
    it (the next batch launched before the last is collected), and the LMDM's DDIM step in ms at batch 1 (a 25-step
    window, after a warm-up window)."""
    import torch

    from ditto_fast.engine.measurements import sample_inputs
    from ditto_fast.motion.ddim import DDIMSampler

    rows, lmdm, dev = [], engine.lmdm, engine.device
    for launch in ("eager", "graphs"):
        fused, denoise = arms.launchers(launch)
        row: dict = {"launch": launch, "warp_decode_ms_per_frame": {}}
        for batch in sorted({1, engine.setup.batch_size}):
            inputs = sample_inputs(fused, batch)
            for _ in range(2):                                   # eager, then captured
                fused(*inputs)
            repeats = max(2, (32 if cuda else 2) // batch)
            t0 = time.perf_counter()
            pending = fused.launch(*inputs)
            for _ in range(repeats - 1):
                following = fused.launch(*inputs)
                fused.collect(pending)
                pending = following
            fused.collect(pending)
            row["warp_decode_ms_per_frame"][batch] = round(1000 * (time.perf_counter() - t0) / (repeats * batch), 3)
        sampler = DDIMSampler(lmdm, 25, engine.config.motion.guidance, denoise)
        cond = torch.zeros((1, lmdm.seq_len, lmdm.cond_dim), device=dev)
        frame = torch.zeros((1, lmdm.motion_dim), device=dev)
        sampler(frame, cond, torch.Generator(device=dev).manual_seed(0))        # eager, captured, replayed
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        sampler(frame, cond, torch.Generator(device=dev).manual_seed(1)).cpu()
        row["ddim_ms_per_step"] = round(1000 * (time.perf_counter() - t0) / 25, 3)
        rows.append(row)
        print(f"launch {launch}: warp + decode ms/frame " + ", ".join(
            f"batch {b} {t:.2f}" for b, t in row["warp_decode_ms_per_frame"].items())
              + f"; DDIM step {row['ddim_ms_per_step']:.2f} ms", flush=True)
    return rows


def render_arms(engine, arms: Arms, audio: Path, warmup: Path, tmp: Path, repeats: int) -> list[dict]:
    """The 1080p render in this process for each arm of ARMS: on CUDA warmed up with a second of speech (the
    graphs captured), then the timed renders alternating between arms; fps of each, the stages of its fastest, and its bytes against the baseline's
    (ARMS[0])."""
    import hashlib

    from ditto_fast.engine.renderer import STAGES
    from ditto_fast.engine.request import RenderRequest

    shown = [k for k in STAGES if k not in ("load_models", "load_avatar")] + ["handoff"]
    rows = {arm: {"output_stage": arm[0], "launch": arm[1], "fps": [], "best": None} for arm in ARMS}
    for arm in ARMS if engine.device.type == "cuda" else ():      # a CPU has nothing to warm up or capture first
        arms.use(*arm)
        engine.render(RenderRequest("gpu_check", warmup, tmp / "warmup.mp4"))
    print(f"1080p render of {audio.name} in this process ({engine.setup.batch_choice}), {repeats} each, alternating:"
          f"\n{'output':>7} {'launch':>7} {'fps':>7} " + " ".join(f"{k[:9]:>9}" for k in shown), flush=True)
    for _ in range(repeats):
        for arm in ARMS:
            arms.use(*arm)
            path = tmp / f"arm_{arm[0]}_{arm[1]}.mp4"
            p = engine.render(RenderRequest("gpu_check", audio, path)).timings
            per = {k: round(1000 * p["stages"][k] / p["frames"], 2) for k in shown if k in p["stages"]}
            row = rows[arm]
            row["fps"].append(round(p["fps"], 2))
            if row["best"] is None or p["fps"] > row["best"]["fps"]:
                row["best"] = {"fps": round(p["fps"], 2), "frames": p["frames"], "encoder": p["encoder"],
                               "ms_per_frame": per}
            row["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            print(f"{arm[0]:>7} {arm[1]:>7} {p['fps']:7.1f} " + " ".join(f"{per.get(k, 0.0):9.2f}" for k in shown),
                  flush=True)
    base = rows[ARMS[0]]["sha256"]
    for arm in ARMS:
        rows[arm]["same_bytes_as_baseline"] = rows[arm]["sha256"] == base
        rows[arm]["launch_counts"] = arms.counts(arm[1])
    arms.use(*ARMS[0])
    print("same bytes as inline eager: " + ", ".join(f"{a[0]} {a[1]} {rows[a]['same_bytes_as_baseline']}"
                                                     for a in ARMS[1:]), flush=True)
    return list(rows.values())


def engine_process(setup, arm: tuple[str, str], audio: Path, tmp: Path, renders: list[dict], budget: Budget,
                   jobs: int = 2, bounded: bool = False) -> dict | None:
    """The same render through an engine process (ditto_fast/handles: how serve and batch render) set to `arm`: its
    start (networks loaded and warmed up), its first job and the ones after (a cold process, then a warm one), fps
    against the same arm in this process, and whether its bytes are those. `bounded`: the start and each job may take
    only what is left of the budget (the engine is killed past it)."""
    import dataclasses
    import hashlib

    from ditto_fast.engine.open_avatars import OpenAvatars
    from ditto_fast.engine.clip import check_clip
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.handles.base import EngineJob, EngineLimits
    from ditto_fast.handles.process import ProcessEngine

    label = f"{arm[0]} {arm[1]}"
    if not budget.fits(20 + 10 * jobs, f"engine process {label}"):
        return None
    child_site = tmp / "child_site"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(child_site)]))} \
        if child_site.is_dir() and any(child_site.iterdir()) else {}
    arm_setup = dataclasses.replace(setup, output_stage=arm[0], launch=arm[1], nvenc=False)
    limits = EngineLimits(start_s=max(10.0, budget.left() - 15)) if bounded else EngineLimits()
    handle = ProcessEngine(arm_setup, name=f"gpu-check-{arm[0]}-{arm[1]}", env=env, limits=limits)
    row: dict = {"output_stage": arm[0], "launch": arm[1], "jobs": []}
    t0 = time.perf_counter()
    try:
        handle.start()
        row["start_s"] = round(time.perf_counter() - t0, 2)
        avatar = OpenAvatars(setup.checkpoints).get("gpu_check")
        for k in range(jobs):
            request = RenderRequest("gpu_check", audio, tmp / f"out_process_{k}.mp4")
            if bounded:
                handle.limits = dataclasses.replace(limits, job_s=max(5.0, budget.left() - 10))
            res = handle.render(EngineJob(request, check_clip(request, avatar, setup.config).audio))
            p = res.timings
            row["jobs"].append({"fps": round(p["fps"], 2), "ms_per_frame": {
                k2: round(1000 * v / p["frames"], 2) for k2, v in p["stages"].items() if k2 not in ("load_models",)}})
    except Exception as e:  # noqa: BLE001 - said in the figures, the rest of the check stands
        print(f"engine process {label}: {type(e).__name__}: {e}", flush=True)
        row["error"] = f"{type(e).__name__}: {e}"
        return row
    finally:
        handle.close()
    same = next((r for r in renders if (r["output_stage"], r["launch"]) == arm), None)
    digest = hashlib.sha256((tmp / f"out_process_{jobs - 1}.mp4").read_bytes()).hexdigest()
    row["fps_in_process"] = same["best"]["fps"] if same else None
    row["same_bytes_as_in_process"] = same is not None and digest == same["sha256"]
    if same:
        row["warm_job_vs_in_process"] = round(row["jobs"][-1]["fps"] / same["best"]["fps"], 3)
    print(f"engine process {label}: started in {row['start_s']} s; jobs " +
          ", ".join(f"{j['fps']} fps" for j in row["jobs"]) + f" (in process {row['fps_in_process']}); same bytes: "
          f"{row['same_bytes_as_in_process']}", flush=True)
    return row


def live_loop(engine, arms: Arms, audio: Path, tmp: Path, overlap: int, steps: int, launch: str,
              budget: Budget) -> dict | None:
    """`ditto-fast live` in this process: the speech file at its own pace into the online loop, the 1080p avatar, a
    .ts stream out (x264), the engine launched as `launch` says; the session's stats, the share of frames on time,
    and what each stage leaves of a frame's 40 ms at 25 fps."""
    from fractions import Fraction

    from ditto_fast.live.outputs import StreamOutput
    from ditto_fast.live.session import LiveSession, LiveSettings
    from ditto_fast.live.sources import open_source
    from ditto_fast.media.rates import SPEECH_SAMPLE_RATE
    from ditto_fast.motion.conditions import emotion_vector

    import wave

    with wave.open(str(audio), "rb") as w:
        speech_s = w.getnframes() / w.getframerate()
    if not budget.fits(speech_s + 8, f"live overlap {overlap}, {steps} steps, {launch}"):
        return None
    arms.use(ARMS[0][0], launch)
    avatar = engine.avatar("gpu_check")
    settings = LiveSettings(emotion=emotion_vector("neutral"), seed=0, steps=steps, codec="h264",
                            overlap=overlap, rate=Fraction(25), blend=engine.config.render.blend, controls=None,
                            max_latency=3.0, stop_at_end=True)
    output = StreamOutput(str(tmp / f"live_{overlap}_{steps}_{launch}.ts"), avatar.size, settings.rate, "yuv420p",
                          crf=engine.setup.crf, preset=engine.setup.preset, encoder="libx264")
    try:
        s = LiveSession(engine, avatar, open_source(str(audio)), output, settings).run()
    finally:
        arms.use(*ARMS[0])
    per = s["ms_per_frame"]
    motion_ms = 1000 * (s["rtf"]["audio_features"] + s["rtf"]["motion"]) / 25
    s["budget_left_ms"] = {"frames thread": round(40 - per["stitch"] - per["render"] - per["handoff"], 1),
                           "output thread": round(40 - per["putback"] - per["write"], 1),
                           "motion thread": round(40 - motion_ms, 1)}
    f, lat = s["frames"], s["latency_s"] or {}
    s["on_time_share"] = round(f["on_time"] / max(1, f["sent"]), 3)
    print(f"live 1080p25, overlap {overlap}, {steps} steps, {launch}: first frame "
          f"{ms(s['first_frame_latency_s'])}, latency median {ms(lat.get('median'))}; "
          f"{f['sent']} frames, {f['on_time']} on time ({100 * s['on_time_share']:.0f} %), {f['repeated']} repeated; "
          "RTF " + ", ".join(f"{k} {v:.3f}" for k, v in s["rtf"].items() if v is not None)
          + "; of 40 ms a frame left: " + ", ".join(f"{k} {v} ms" for k, v in s["budget_left_ms"].items()), flush=True)
    return {"overlap": overlap, "steps": steps, "launch": launch, **s}


def sessions_arm(engine, audio: Path, tmp: Path, budget: Budget, cuda: bool) -> list[dict]:
    """N live sessions at once on one engine (the 1080p avatar at 25 fps, 25 steps, overlap 70, launched with graphs),
    each reading the speech file at its own pace to a .ts of its own, sharing one warp + decode and one DDIM sampler as
    handles/engine_sessions.py shares them (each batch size captured before they stream); N grows while every
    session holds 95 % of its frames on time. On a CPU the graphs' stand-in (core/graphs.py Rerun) runs the path."""
    import threading
    import wave
    from fractions import Fraction

    from ditto_fast.core.graphs import BUCKETS, Launched
    from ditto_fast.engine.measurements import sample_inputs
    from ditto_fast.live.outputs import StreamOutput
    from ditto_fast.live.session import LiveSession, LiveSettings
    from ditto_fast.live.sources import open_source
    from ditto_fast.motion.conditions import emotion_vector
    from ditto_fast.motion.ddim import DDIMSampler, Denoiser
    from ditto_fast.motion.shared_windows import SharedWindows
    from ditto_fast.render.shared_fused import SharedFused

    with wave.open(str(audio), "rb") as w:
        speech_s = w.getnframes() / w.getframerate()
    counts = (SESSIONS if cuda else SESSIONS[:2])
    if not budget.fits(speech_s + 20, f"{counts[0]} live session(s) at once"):
        return []
    fused = engine.fused.twin(launch="graphs", max_graphs=len(BUCKETS))
    denoise = Denoiser(engine.lmdm, "graphs")
    if not cuda:
        fused._launched = Launched(fused._warp_decode, cuda=False, max_graphs=len(BUCKETS))
        denoise._launched = Launched(denoise._flat, cuda=False, max_graphs=len(BUCKETS) + 1, skip_unchanged=True)
    shared = SharedFused(fused)
    windows = SharedWindows(DDIMSampler(engine.lmdm, 25, engine.config.motion.guidance, denoise))
    t0 = time.perf_counter()
    shared.warm(sample_inputs(engine.fused, 1))
    windows.warm()
    warm_s = round(time.perf_counter() - t0, 2)
    avatar = engine.avatar("gpu_check")
    settings = LiveSettings(emotion=emotion_vector("neutral"), seed=0, steps=25, codec="h264", overlap=70,
                            rate=Fraction(25), blend=engine.config.render.blend, controls=None, max_latency=3.0,
                            stop_at_end=True)

    def captures() -> int:
        return sum(x._launched.counts["capture"] for x in (fused, denoise))

    rows = []
    for n in counts:
        if rows and not budget.fits(speech_s + 10, f"{n} live sessions at once"):
            break
        stats: list = [None] * n
        before = captures()

        def one(i: int) -> None:
            output = StreamOutput(str(tmp / f"sessions_{n}_{i}.ts"), avatar.size, settings.rate, "yuv420p",
                                  crf=engine.setup.crf, preset=engine.setup.preset, encoder="libx264")
            stats[i] = LiveSession(engine, avatar, open_source(str(audio)), output, settings, fused=shared,
                                   windows=lambda steps: windows).run()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        on_time = [s["frames"]["on_time"] / max(1, s["frames"]["sent"]) for s in stats]
        firsts = [s["first_frame_latency_s"] for s in stats]
        row = {"sessions": n, "on_time_fraction": round(min(on_time), 3),
               "first_frame_latency_s": None if None in firsts else max(firsts),
               "latency_median_s": max((s["latency_s"] or {}).get("median", 0) for s in stats),
               "captures_while_streaming": captures() - before, "warm_up_s": warm_s,
               "per_session": [{"on_time_fraction": round(f, 3), "first_frame_latency_s": s["first_frame_latency_s"],
                                "frames": s["frames"], "ms_per_frame": s["ms_per_frame"]}
                               for f, s in zip(on_time, stats)]}
        rows.append(row)
        print(f"{n} live session(s) at once, 1080p25, 25 steps, graphs: worst {100 * row['on_time_fraction']:.0f} % "
              f"of frames on time, slowest first frame {ms(row['first_frame_latency_s'])}, "
              f"{row['captures_while_streaming']} captures while streaming", flush=True)
        if row["on_time_fraction"] < 0.95 and cuda:
            break
    return rows


def encoder_arms(rendered: Path, setup, budget: Budget) -> list[dict]:
    """x264 on its own, as a render feeds it (1080p yuv420p frames through its pipe, the render's crf and preset):
    ms a frame with its own thread count (auto) and with counts sized to this host, the frames of the baseline
    render read back."""
    import imageio_ffmpeg
    import numpy as np

    from ditto_fast.encoding.writer import VideoWriter
    from ditto_fast.media.yuv import I420

    if not rendered.is_file() or not budget.fits(30, "the encoder's threads"):
        return []
    w, h = next(imageio_ffmpeg.read_frames(str(rendered)))["size"]
    raw = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(rendered), "-f", "rawvideo",
                          "-pix_fmt", "yuv420p", "-"], capture_output=True, check=True).stdout
    frames = list(np.frombuffer(raw, np.uint8).reshape(-1, *I420.shape(w, h)))
    cpus = os.cpu_count() or 2
    rows = []
    for threads in (None, *sorted({max(1, cpus // 4), max(1, cpus // 2), cpus})):
        t0 = time.perf_counter()
        with VideoWriter(rendered.with_name(f"enc_{threads}.mp4"), (w, h), fps=25, crf=setup.crf, preset=setup.preset,
                         pix_fmt="yuv420p", threads=threads) as writer:
            for f in frames:
                writer.write(f)
        ms = 1000 * (time.perf_counter() - t0) / len(frames)
        rows.append({"threads": threads or "auto", "ms_per_frame": round(ms, 2), "fps": round(1000 / ms, 1)})
    print("x264 alone, 1080p, ms a frame: " + ", ".join(f"threads {r['threads']} {r['ms_per_frame']}" for r in rows),
          flush=True)
    return rows


def nvenc(engine, arms: Arms, audio: Path, tmp: Path, nvenc_works, budget: Budget) -> dict:
    """Whether NVENC encodes here, with the carried ffmpeg and with the machine's own (a driver too old for the
    carried ffmpeg's NVENC headers may take an older ffmpeg's); where the carried one works, the baseline render
    through it."""
    import shutil as sh

    from ditto_fast.engine.request import RenderRequest

    works, why = nvenc_works("h264")
    row: dict = {"carried": True if works else f"does not work: {why}"}
    own = sh.which("ffmpeg")
    if own and own != os.environ.get("IMAGEIO_FFMPEG_EXE"):
        res = subprocess.run([own, "-hide_banner", "-nostdin", "-loglevel", "error", "-f", "lavfi", "-i",
                              "color=black:s=256x256:r=25", "-frames:v", "2", "-c:v", "h264_nvenc", "-f", "null", "-"],
                             capture_output=True, text=True, timeout=60)
        row["machine"] = {"ffmpeg": own, "works": res.returncode == 0, "said": res.stderr.strip()[-200:]}
    else:
        row["machine"] = "no ffmpeg of its own on PATH"
    print(f"NVENC: carried ffmpeg {row['carried']}; the machine's: {row['machine']}", flush=True)
    if works and budget.fits(15, "the render through NVENC"):
        arms.use(*ARMS[0], nvenc=True)
        try:
            p = engine.render(RenderRequest("gpu_check", audio, tmp / "out_nvenc.mp4")).timings
        finally:
            arms.use(*ARMS[0])
        row["render"] = {"fps": round(p["fps"], 2), "encoder": p["encoder"],
                         "ms_per_frame": {k: round(1000 * v / p["frames"], 2) for k, v in p["stages"].items()}}
        print(f"render through {p['encoder']}: {p['fps']:.1f} fps", flush=True)
    return row


def compile_arm(setup, audio: Path, tmp: Path, renders: list[dict], budget: Budget) -> dict | str:
    """launch compile (torch.compile, mode reduce-overhead) in an engine process that may take what is left of the
    budget to start (its warm-up compiles) and render, and is killed past it."""
    if not budget.fits(COMPILE_AT_LEAST_S, "launch compile"):
        return "skipped: not enough of the budget left"
    row = engine_process(setup, ("thread", "compile"), audio, tmp, renders, budget, jobs=1, bounded=True)
    return row if row is not None else "skipped"


if __name__ == "__main__":
    sys.exit(main())
