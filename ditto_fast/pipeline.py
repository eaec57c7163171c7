"""The render engine: `Renderer` loads the networks and HuBERT once, then renders clip after clip.

Each clip runs the synchronous loop audio -> features -> motion -> per-frame stitch, warp+decode,
putback, write: one thread, frames in order, deterministic for a seed (the same bytes whether a clip
is an engine's first or tenth). Overlap comes only from what is already asynchronous: CUDA kernel
launches and the ffmpeg reader/writer processes. Nothing here prints or changes process-wide state;
progress goes to a callback and the stage timings into the result's profile.

Stage keys of the profile and the table (wall seconds each):
  load_models     finding the checkpoints and loading the networks and HuBERT
  load_avatar     opening the avatar cache
  audio_features  HuBERT features of the decoded audio
  motion          conditions and LMDM sampling (the 25 fps motion of the whole clip)
  stitch          each output frame's keypoints: motion mixed into the source, controls, stitching network
  render          fused warp + decode on the device, crops back on the host
  putback         pasting each crop into its background frame
  write           the loop's ffmpeg I/O: handing each frame to the encoder and getting each background
                  frame from the plate decoder (both are ffmpeg pipes, so both waits land here)

`stages_cpu` has the same keys: CPU seconds of the loop's own thread in each stage (not torch's or
OpenCV's worker threads, nor ffmpeg), so write's wall minus its CPU is the time spent waiting for ffmpeg;
load_models happens before a render and is 0 there.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import __version__, models
from .audio.decode import SAMPLE_RATE, frame_count, load_audio
from .audio.hubert import HubertFeatures
from .avatar import Avatar, load_avatar
from .avatar.format import PKL_NAME
from .avatar.plate import PlateReader, mirror_positions
from .avatar.store import avatars_dir
from .checkpoints import CheckpointSet, find_checkpoints
from .config import Config, check_setting, load_config
from .devices import resolve_device, resolve_precision
from .errors import InputError, UsageError
from .motion.conditions import build_conditions, condition_parts, emotion_schedule, schedule_file
from .motion.controls import load_controls
from .motion.ddim import DDIMSampler
from .motion.keypoints import info_to_motion, motion_to_info
from .motion.lips import lip_opening
from .motion.sampling import MotionSampler
from .motion.stitch import MotionStitch
from .rates import MOTION_FPS, frames_for, motion_timeline, parse_rate, rate_text, source_indices
from .render.batch_size import auto_batch_size
from .render.formats import Format, nvenc_works, output_format
from .render.fused import FusedRenderer
from .render.precision import cpu_precision
from .render.putback import YuvPutback
from .render.writer import VideoWriter, check_output_path
from .timing import StageTimer

STAGES = ("load_models", "load_avatar", "audio_features", "motion", "stitch", "render", "putback", "write")


Progress = Callable[[int, int], None]      # (frames done, frames in the clip)


@dataclass
class RenderResult:
    output: Path
    profile: dict
    mouth: np.ndarray | None = None     # [N] generated lip opening per output frame (for the render preview)


def stage_table(profile: dict) -> str:
    """The human-readable stage table of a render's profile."""
    n = max(1, profile["frames"])
    lines = [f"{'stage':<16}{'seconds':>10}{'ms/frame':>11}"]
    for s in STAGES:
        sec = profile["stages"][s]
        lines.append(f"{s:<16}{sec:>10.2f}{1000 * sec / n:>11.1f}")
    lines.append(f"{'total':<16}{profile['wall_seconds']:>10.2f}{1000 * profile['wall_seconds'] / n:>11.1f}")
    lines.append(f"{profile['frames']} frames, {profile['audio_seconds']:.2f} s audio, {profile['fps']:.2f} fps, "
                 f"{profile['device']} {profile['precision']}, {profile['steps']} steps, {profile['rate']} fps "
                 f"{profile['container']} {profile['encoder']}, batch {profile['batch_size']}"
                 + (" — RANDOM WEIGHTS: the face region is noise" if profile["random_weights"] else ""))
    return "\n".join(lines)


def default_output(avatar: str, audio: Path) -> Path:
    """<avatar>_<audio stem>.mp4 in the current directory."""
    return Path.cwd() / f"{avatar}_{Path(audio).stem}.mp4"


@dataclass
class Clip:
    """One render's inputs, checked: the output's rate, format and frame count, emotion per frame, controls."""

    avatar: Avatar
    audio: Path
    output: Path
    frames: int                         # N output frames at `rate`
    emotion: np.ndarray                 # [N, 8]
    controls: object | None
    steps: int
    seed: int
    rate: Fraction = Fraction(MOTION_FPS)
    format: Format = Format("mp4", "h264")


def _clip_rate(fps: str | float | Fraction | None, avatar: Avatar) -> Fraction:
    """The output rate: `fps` if given (one of the broadcast rates), else the avatar's own."""
    if fps is None:
        return avatar.rate
    try:
        return parse_rate(fps)
    except ValueError as e:
        raise UsageError(str(e)) from None


def overwrites(output: Path, source: Path) -> bool:
    """Whether writing `output` would replace `source` or a file inside it (symbolic links followed)."""
    if not os.path.lexists(source):
        return False
    out, src = output.resolve(), source.resolve()
    return out == src or src in out.parents


def check_clip(avatar: Avatar, audio: str | Path, output: str | Path, *, seed: int = 0, emotion: str = "neutral",
               controls: str | Path | None = None, steps: int | None = None, config: Config | None = None,
               fps: str | float | Fraction | None = None, codec: str | None = None) -> Clip:
    """Check one render's inputs without any network: audio decodes, emotion and controls parse for its
    length, the rate and the output's container and codec are supported, the output can be written and
    is none of the inputs. Raises the DittoError a user caused."""
    cfg = config or load_config()
    steps = cfg.motion.steps if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000:
        raise UsageError(f"steps must be an integer in 1..1000, got {steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise UsageError(f"seed must be an integer in 0..{2**63 - 1}, got {seed!r}")
    audio, output = Path(audio), Path(output)
    check_output_path(output)
    emotion_file = schedule_file(emotion)
    for p in (audio, *([Path(controls)] if controls else []), *([emotion_file] if emotion_file else []), avatar.dir):
        if overwrites(output, p):
            raise UsageError(f"{output}: the output would overwrite an input ({p}); choose another output path")
    fmt = output_format(output, codec)
    rate = _clip_rate(fps, avatar)
    n = frames_for(len(load_audio(audio)), rate)
    return Clip(avatar, audio, output, n, emotion_schedule(emotion, n),
                load_controls(controls, n) if controls else None, steps, seed, rate, fmt)


def _identity(avatar_dir: Path) -> tuple[int, int] | None:
    """What changes when an avatar directory is replaced: its record file's inode and mtime (None if gone)."""
    try:
        st = os.stat(avatar_dir / PKL_NAME)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _avatar_identity(avatar: Avatar) -> str:
    """A hash of the loaded avatar's record: its files' checksums, source and creation time."""
    m = avatar.meta
    return hashlib.sha256(pickle.dumps((m["checksums"], m["source"], m["created"]), protocol=5)).hexdigest()


def clip_digest(clip: Clip, emotion: str, controls: str | Path | None, settings: dict) -> str:
    """What an output was made from, as a short string written into its comment tag: the same inputs and
    settings give the same digest (batch skips a job whose output carries it)."""
    emo = schedule_file(emotion)
    parts = {
        "version": __version__, "audio": _file_sha256(clip.audio), "seed": clip.seed, "steps": clip.steps,
        "emotion": _file_sha256(emo) if emo is not None else emotion,
        "rate": rate_text(clip.rate), "container": clip.format.container, "codec": clip.format.codec,
        "controls": _file_sha256(Path(controls)) if controls else None,
        "avatar": _avatar_identity(clip.avatar), **settings,
    }
    return f"ditto-fast {__version__} " + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


@dataclass
class RenderSetup:
    """Everything about an engine that decides its outputs' bytes, settled before any network loads."""

    config: Config
    checkpoints: CheckpointSet
    device: torch.device
    dtype: torch.dtype
    batch_size: int
    crf: int
    preset: str
    nvenc: bool = False              # H.264/HEVC through the GPU's encoder
    precision_choice: str = ""       # why `auto` gave this precision
    batch_choice: str = ""           # why `auto` gave this batch size

    @classmethod
    def resolve(cls, checkpoints: str | Path | CheckpointSet | None = None, device: str = "auto",
                precision: str = "auto", config: Config | None = None, batch_size: int | str | None = None,
                crf: int | None = None, preset: str | None = None, encoder: str = "auto") -> "RenderSetup":
        """Find the checkpoints, pick device, precision and encoder, fill what is not given from the config.

        encoder: "software" (x264/x265), "nvenc" (the GPU's encoder; refused if it does not work here) or
        "auto" (NVENC when rendering on CUDA and it works, else software)."""
        config = config or load_config()
        cs = checkpoints if isinstance(checkpoints, CheckpointSet) else find_checkpoints(checkpoints)
        dev = resolve_device(device)
        r = config.render
        dtype, why = resolve_precision(precision, dev), ""
        if precision == "auto" and dev.type == "cpu":     # the fastest precision good enough on this CPU
            dtype, why = cpu_precision(cs)
        batch = check_setting("render", "batch_size", batch_size or r.batch_size, "batch size")
        if batch == "auto":                     # 1 on a CPU; on CUDA the probe's verdict (measured once per GPU)
            batch, batch_why = auto_batch_size(cs, dev, dtype)
        else:
            batch_why = f"{batch}: set by --batch-size or render.batch_size"
        return cls(config, cs, dev, dtype, batch, r.crf if crf is None else crf, preset or r.preset,
                   _use_nvenc(encoder, dev), why, batch_why)

    def output_format(self, clip: Clip) -> Format:
        """The clip's format with this setup's encoder (the software one for a codec whose NVENC does not work
        here: the setup probed H.264's)."""
        nvenc = self.nvenc and clip.format.codec in ("h264", "hevc") and nvenc_works(clip.format.codec)[0]
        return dataclasses.replace(clip.format, nvenc=nvenc)

    def digest(self, clip: Clip, emotion: str = "neutral", controls: str | Path | None = None) -> str:
        """What a render of `clip` with this setup writes into its output's comment tag (see clip_digest)."""
        settings = {"checkpoints": self.checkpoints.fingerprints(), "device": self.device.type,
                    "precision": str(self.dtype), "batch_size": self.batch_size, "crf": self.crf,
                    "preset": self.preset, "encoder": self.output_format(clip).encoder,
                    "motion": dataclasses.asdict(self.config.motion)}
        return clip_digest(clip, emotion, controls, settings)


def _use_nvenc(encoder: str, device: torch.device) -> bool:
    """Whether to encode with NVENC: asked for (and working), or `auto` on a CUDA device where it works."""
    if encoder not in ("auto", "software", "nvenc"):
        raise UsageError(f"unknown encoder {encoder!r}; use auto, software or nvenc")
    if encoder == "software" or (encoder == "auto" and device.type != "cuda"):
        return False
    works, why = nvenc_works("h264")
    if encoder == "nvenc" and not works:
        raise UsageError(f"NVENC does not work on this machine ({why}); use --encoder software or auto")
    return works


class Renderer:
    """Loads the networks and HuBERT once; `render()` then makes one clip per call, again and again.

    Avatars are opened once per name and reopened only when the store's copy was replaced.
    """

    def __init__(self, checkpoints: str | Path | CheckpointSet | None = None, device: str = "auto",
                 precision: str = "auto", config: Config | None = None, batch_size: int | None = None,
                 crf: int | None = None, preset: str | None = None, encoder: str = "auto", *,
                 setup: RenderSetup | None = None):
        """Load the networks for `checkpoints` (default: $DITTO_FAST_CHECKPOINTS or ./checkpoints) on `device`,
        or for an already resolved `setup`."""
        t0 = time.perf_counter()
        self.setup = setup or RenderSetup.resolve(checkpoints, device, precision, config, batch_size, crf, preset,
                                                  encoder)
        self.config, self.checkpoints = self.setup.config, self.setup.checkpoints
        self.device, self.dtype = self.setup.device, self.setup.dtype
        files = self.checkpoints.files
        self.lmdm = models.load("lmdm", files["lmdm"], self.device)
        if self.config.motion.overlap >= self.lmdm.seq_len:
            raise UsageError(f"motion.overlap {self.config.motion.overlap} must be below the LMDM's window of "
                             f"{self.lmdm.seq_len} frames")
        self.stitch_net = models.load("stitch_network", files["stitch_network"], "cpu")
        self.fused = FusedRenderer(files["warp_network"], files["decoder"], self.device, self.dtype)
        self.hubert = HubertFeatures(self.checkpoints.hubert_dir, device=self.device)
        self.random_weights = bool(self.checkpoints.random_weights or any(
            getattr(m, "ditto_meta", {}).get("random_weights") for m in (self.lmdm, self.stitch_net)))
        self._avatars: dict[str, tuple[tuple[int, int] | None, Avatar]] = {}
        self.load_seconds = time.perf_counter() - t0

    def avatar(self, name: str) -> Avatar:
        """The avatar `name`, opened once and checked against these checkpoints; reopened if replaced since."""
        cached = self._avatars.get(name)
        if cached is not None and _identity(cached[1].dir) == cached[0]:
            return cached[1]
        key = _identity(avatars_dir() / name)
        avatar = load_avatar(name, expected_fingerprints=self.checkpoints.avatar_fingerprints())
        self._avatars[name] = (key, avatar)
        return avatar

    def check(self, avatar: str, audio: str | Path, output: str | Path | None = None, *, seed: int = 0,
              emotion: str = "neutral", controls: str | Path | None = None, steps: int | None = None,
              fps: str | float | Fraction | None = None, codec: str | None = None) -> Clip:
        """A render's inputs checked (see check_clip), the avatar opened."""
        out = Path(output) if output else default_output(avatar, Path(audio))
        return check_clip(self.avatar(avatar), audio, out, seed=seed, emotion=emotion, controls=controls,
                          steps=steps, config=self.config, fps=fps, codec=codec)

    def render(self, avatar: str, audio: str | Path, output: str | Path | None = None, *, seed: int = 0,
               emotion: str = "neutral", controls: str | Path | None = None, steps: int | None = None,
               fps: str | float | Fraction | None = None, codec: str | None = None,
               progress: Progress | None = None) -> RenderResult:
        """Render `audio` spoken by `avatar` into `output` (written to a temporary name, renamed when complete).

        `fps`: the output rate (default: the avatar's); `codec`: h264, hevc or prores (the container
        follows the output's extension: .mp4, .mov, .mkv)."""
        t_start = time.perf_counter()
        timer = StageTimer(STAGES)
        with timer("load_avatar"):
            opened = self.avatar(avatar)
        clip = check_clip(opened, audio, Path(output) if output else default_output(avatar, Path(audio)), seed=seed,
                          emotion=emotion, controls=controls, steps=steps, config=self.config, fps=fps, codec=codec)
        digest = self.setup.digest(clip, emotion, controls)
        seconds, mouth = self._render(clip, digest, timer, progress)
        wall = time.perf_counter() - t_start
        profile = {
            "frames": clip.frames, "audio_seconds": seconds, "wall_seconds": wall,
            "fps": clip.frames / wall if wall else 0.0, "device": str(self.device),
            "precision": str(self.dtype).replace("torch.", ""), "precision_choice": self.setup.precision_choice,
            "batch_choice": self.setup.batch_choice,
            "steps": clip.steps, "seed": clip.seed,
            "rate": rate_text(clip.rate), "container": clip.format.container, "codec": clip.format.codec,
            "encoder": self.setup.output_format(clip).encoder, "batch_size": self.setup.batch_size,
            "random_weights": bool(self.random_weights or clip.avatar.random_weights), "output": str(clip.output),
            "digest": digest, "stages": {k: round(v, 4) for k, v in timer.seconds.items()},
            "stages_cpu": {k: round(v, 4) for k, v in timer.thread_seconds.items()},
        }
        return RenderResult(clip.output, profile, mouth)

    def _render(self, clip: Clip, digest: str, timer: StageTimer,
                progress: Progress | None) -> tuple[float, np.ndarray]:
        """The loop for one checked clip; returns the audio's length in seconds and the generated lip
        opening [N] per output frame.

        Motion is made at 25 fps; output frame i (time i / rate) blends the two motion frames around
        its time and shows the source frame at that time (mirror-looped), so nothing drifts at any rate.
        """
        avatar, n = clip.avatar, clip.frames
        # the source frame shown at each output frame; the plate reader is told them all, so ffmpeg decodes
        # its first block beside HuBERT and the LMDM, and each next block while one is pasted into
        src_idx = mirror_positions(source_indices(n, clip.rate, avatar.rate), avatar.n_frames)
        with PlateReader(avatar.plate_source, avatar.n_frames, is_image=avatar.is_image, pix_fmt="yuv420p",
                         order=src_idx) as plate:
            return self._render_with(clip, digest, timer, progress, src_idx, plate)

    def _render_with(self, clip: Clip, digest: str, timer: StageTimer, progress: Progress | None,
                     src_idx: np.ndarray, plate: PlateReader) -> tuple[float, np.ndarray]:
        """_render's work once the plate is open: `src_idx` [N] is each output frame's source frame."""
        avatar, n = clip.avatar, clip.frames
        audio = load_audio(clip.audio)
        n_motion = frame_count(len(audio))
        with timer("audio_features"):
            feats = self.hubert(audio)                                  # [M, 1024] at 25 fps
        if feats.shape[0] != n_motion or frames_for(len(audio), clip.rate) != n:
            raise InputError(f"{clip.audio}: changed while it was being rendered; render it again")
        src_rate = avatar.rate
        # the source frame at each motion frame (for the eye conditions)
        motion_src = mirror_positions(source_indices(n_motion, Fraction(MOTION_FPS), src_rate), avatar.n_frames)
        # output frame of each motion frame's time, for the per-frame emotion (schedules count output frames)
        emo_rows = np.minimum(source_indices(n_motion, Fraction(MOTION_FPS), clip.rate), n - 1)
        j0, j1, w = motion_timeline(n, clip.rate, n_motion)
        with timer("motion"):
            parts = condition_parts(self.lmdm.cond_dim, feats.shape[1])
            cond = build_conditions(feats, parts, clip.emotion[emo_rows], avatar.eye_open, avatar.eye_ball, avatar.sc,
                                    src_idx=motion_src)
            del feats
            gen = torch.Generator(device=self.device).manual_seed(clip.seed)
            m = self.config.motion
            sampler = MotionSampler(DDIMSampler(self.lmdm, clip.steps, m.guidance), window=self.lmdm.seq_len,
                                    overlap=m.overlap, smooth_window=m.smooth_window, device=self.device)
            motion = sampler(cond, info_to_motion(avatar.frame_info(0)), gen)   # [M, 265]
            del cond
            lips = lip_opening(motion, avatar.sc)                                # [M] at 25 fps
            mouth = lips[j0] + w.astype(np.float32) * (lips[j1] - lips[j0])      # [N] at the output rate

        stitch = MotionStitch(self.stitch_net, is_image=avatar.is_image, controls=clip.controls)
        putback = YuvPutback()
        bs = self.setup.batch_size
        batches = [range(b0, min(n, b0 + bs)) for b0 in range(0, n, bs)]

        def launch(idx: range):
            """Stitch a batch's keypoints (all its frames at once) and start its warp + decode."""
            rows = slice(idx.start, idx.stop)
            src = src_idx[rows]                                  # the source frame of each output frame
            with timer("stitch"):
                x_s, x_d = stitch.batch(avatar.frame_infos(src), motion_to_info(motion[j0[rows]]),
                                        motion_to_info(motion[j1[rows]]), w[rows])
            with timer("render"):
                return self.fused.launch(avatar.f_s[src], x_s, x_d)

        # look-ahead: batch k+1 is launched before batch k is pasted and written, so a GPU computes while
        # this thread works; frames still go out in order, and the output is the same either way
        ahead = self.config.render.lookahead
        # the plate's own yuv420p goes to the encoder: only the face box is converted and blended
        with VideoWriter(clip.output, avatar.size, fps=clip.rate, audio_path=clip.audio, crf=self.setup.crf,
                         preset=self.setup.preset, comment=digest, frames=n,
                         fmt=self.setup.output_format(clip), pix_fmt="yuv420p") as writer:
            pending = launch(batches[0]) if batches else None
            for k, idx in enumerate(batches):
                following = batches[k + 1] if k + 1 < len(batches) else None
                after = launch(following) if ahead and following else None
                with timer("render"):
                    crops = self.fused.collect(pending)                  # uint8 [b,512,512,3]
                for j, i in enumerate(idx):
                    with timer("write"):                 # ffmpeg I/O: the plate decoder here, the encoder below
                        background = plate.frame(int(src_idx[i]))
                    with timer("putback"):
                        frame = putback(background, crops[j], avatar.M_c2o[src_idx[i]])
                    with timer("write"):
                        writer.write(frame)
                if progress is not None:
                    progress(idx.stop, n)
                pending = after if ahead else (launch(following) if following else None)
        return len(audio) / SAMPLE_RATE, mouth
