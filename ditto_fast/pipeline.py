"""The synchronous render loop: audio -> features -> motion -> per-frame stitch, warp+decode, putback, write.

One thread, frames in order, deterministic for a seed. Overlap comes only from what is already
asynchronous: CUDA kernel launches and the ffmpeg reader/writer processes. This module owns timing,
progress and the stage table; the stages below it never print.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import models
from .audio.decode import frame_count, load_audio
from .audio.hubert import HubertFeatures
from .avatar import load_avatar
from .checkpoints import find_checkpoints
from .config import Config
from .devices import resolve_device, resolve_precision
from .errors import UsageError
from .models.ddim import ddim_sample
from .motion.conditions import build_conditions, condition_parts, emotion_schedule, mirror_indices
from .motion.controls import load_controls
from .motion.keypoints import info_to_motion, motion_to_info
from .motion.sampling import MotionSampler
from .motion.stitch import MotionStitch
from .render.fused import FusedRenderer
from .render.plate import PlateReader
from .render.putback import Putback
from .render.writer import VideoWriter, check_output_path
from .memory import serve_frames_from_mmap
from .timing import StageTimer

STAGES = ("load_models", "load_avatar", "audio_features", "motion", "render", "putback", "write")


@dataclass
class RenderOptions:
    avatar: str
    audio: Path
    output: Path | None = None
    steps: int | None = None          # None: config's motion.steps
    seed: int = 0
    emotion: str = "neutral"
    controls: Path | None = None
    device: str = "auto"
    precision: str = "auto"
    batch_size: int | None = None
    crf: int | None = None
    preset: str | None = None
    checkpoints: Path | None = None
    config: Config | None = None
    profile: Path | None = None
    quiet: bool = False


@dataclass
class RenderResult:
    output: Path
    profile: dict
    table: str = ""


def stage_table(profile: dict) -> str:
    """The human-readable stage table printed after a render."""
    n = max(1, profile["frames"])
    lines = [f"{'stage':<16}{'seconds':>10}{'ms/frame':>11}"]
    for s in STAGES:
        sec = profile["stages"][s]
        lines.append(f"{s:<16}{sec:>10.2f}{1000 * sec / n:>11.1f}")
    lines.append(f"{'total':<16}{profile['wall_seconds']:>10.2f}{1000 * profile['wall_seconds'] / n:>11.1f}")
    lines.append(f"{profile['frames']} frames, {profile['audio_seconds']:.2f} s audio, {profile['fps']:.2f} fps, "
                 f"{profile['device']} {profile['precision']}, {profile['steps']} steps"
                 + (" — RANDOM WEIGHTS: the face region is noise" if profile["random_weights"] else ""))
    return "\n".join(lines)


def default_output(avatar: str, audio: Path) -> Path:
    """<avatar>_<audio stem>.mp4 in the current directory."""
    return Path.cwd() / f"{avatar}_{Path(audio).stem}.mp4"


def _progress(total: int, quiet: bool):
    if quiet:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="frame", desc="render", dynamic_ncols=True, leave=False)


def render_video(opts: RenderOptions) -> RenderResult:
    """Render opts.audio spoken by opts.avatar into opts.output (atomic); returns the path and the profile."""
    t_start = time.perf_counter()
    serve_frames_from_mmap()
    timer = StageTimer(STAGES)
    cfg = opts.config or Config()
    steps = cfg.motion.steps if opts.steps is None else opts.steps
    out_path = Path(opts.output) if opts.output else default_output(opts.avatar, opts.audio)
    check_output_path(out_path)
    device = resolve_device(opts.device)
    dtype = resolve_precision(opts.precision, device)
    if steps < 1:
        raise UsageError("--steps must be at least 1")

    with timer("load_models"):
        cs = find_checkpoints(opts.checkpoints)
    with timer("load_avatar"):
        avatar = load_avatar(opts.avatar, expected_fingerprints=cs.avatar_fingerprints())
    audio = load_audio(opts.audio)          # fails fast on bad audio, before the heavy models load
    n = frame_count(len(audio))
    emotion = emotion_schedule(opts.emotion, n)
    controls = load_controls(opts.controls, n) if opts.controls else None
    with timer("load_models"):
        lmdm = models.load("lmdm", cs.files["lmdm"], device)
        lmdm.guidance_weight = cfg.motion.guidance
        stitch_net = models.load("stitch_network", cs.files["stitch_network"], "cpu")
        renderer = FusedRenderer(cs.files["warp_network"], cs.files["decoder"], device, dtype)
        hubert = HubertFeatures(cs.hubert_dir, device=device)
    random_weights = bool(cs.random_weights or avatar.random_weights or
                          any(getattr(m, "ditto_meta", {}).get("random_weights") for m in (lmdm, stitch_net)))

    with timer("audio_features"):
        feats = hubert(audio)                                       # [N, 1024]
    assert feats.shape[0] == n

    with timer("motion"):
        parts = condition_parts(lmdm.cond_dim, feats.shape[1])
        cond = build_conditions(feats, parts, emotion, avatar.eye_open, avatar.eye_ball, avatar.sc)
        del feats
        gen = torch.Generator(device=device).manual_seed(opts.seed)
        m = cfg.motion
        sampler = MotionSampler(lambda cf, c, g: ddim_sample(lmdm, cf, c, steps, g), window=m.window,
                                overlap=m.overlap, smooth_window=m.smooth_window, smooth_dims=m.smooth_dims,
                                device=device)
        motion = sampler(cond, info_to_motion(avatar.frame_info(0)), gen)   # [N, 265]
        del cond

    src_idx = mirror_indices(n, avatar.n_frames)
    stitch = MotionStitch(stitch_net, is_image=avatar.is_image, controls=controls)
    putback = Putback()
    bar = _progress(n, opts.quiet)
    bs = max(1, opts.batch_size or cfg.render.batch_size)
    try:
        with PlateReader(avatar.plate_path, avatar.n_frames) as plate, \
                VideoWriter(out_path, avatar.size, fps=25, audio_path=opts.audio,
                            crf=cfg.render.crf if opts.crf is None else opts.crf,
                            preset=opts.preset or cfg.render.preset) as writer:
            for b0 in range(0, n, bs):
                idx = range(b0, min(n, b0 + bs))
                with timer("motion"):
                    kps = [stitch(avatar.frame_info(int(src_idx[i])), motion_to_info(motion[i])) for i in idx]
                    x_s = np.concatenate([k[0] for k in kps], 0)
                    x_d = np.concatenate([k[1] for k in kps], 0)
                with timer("render"):
                    crops = renderer(avatar.f_s[src_idx[b0:b0 + len(idx)]], x_s, x_d)   # uint8 [b,512,512,3]
                for j, i in enumerate(idx):
                    with timer("write"):                 # ffmpeg I/O: plate decode here, encode below
                        background = plate[i]
                    with timer("putback"):
                        frame = putback(background, crops[j], avatar.M_c2o[src_idx[i]])
                    with timer("write"):
                        writer.write(frame)
                if bar is not None:
                    bar.update(len(idx))
    finally:
        if bar is not None:
            bar.close()

    wall = time.perf_counter() - t_start
    profile = {
        "frames": n, "audio_seconds": len(audio) / 16000.0, "wall_seconds": wall, "fps": n / wall if wall else 0.0,
        "device": str(device), "precision": str(dtype).replace("torch.", ""), "steps": steps,
        "seed": opts.seed, "random_weights": random_weights, "output": str(out_path),
        "stages": {k: round(v, 4) for k, v in timer.seconds.items()},
    }
    if opts.profile:
        tmp = Path(opts.profile).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(profile, indent=2) + "\n")
        os.replace(tmp, opts.profile)
    return RenderResult(out_path, profile, stage_table(profile))
