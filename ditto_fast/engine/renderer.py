"""The render engine: `Renderer` loads the networks and HuBERT once, then renders clip after clip.

Each clip runs the synchronous loop audio -> features -> motion -> per-frame stitch, warp+decode,
putback, write: frames in order, deterministic for a seed (the same bytes whether a clip is an engine's
first or tenth). By default one thread: overlap comes from what is already asynchronous, CUDA kernel
launches and the ffmpeg reader/writer processes; the engine option `output_stage` "thread" moves the
putback and write to a thread of their own (the same bytes), and `launch` says how the LMDM's DDIM step
and warp + decode reach the device (core/graphs.py). Nothing here prints or changes process-wide state;
progress goes to a callback, `progress(stage, done, total)` for the audio features, the motion and the frames
in turn (see engine/stages.py), and the stage timings into the result's timings.

Stage keys of the timings and the table (wall seconds each):
  load_models     finding the checkpoints and loading the networks and HuBERT (in an engine's first render;
                  0 in the ones after it, which load nothing; the speech-emotion classifier in the first `auto` one)
  load_avatar     opening the avatar cache (0 for a Clip checked before: its avatar is open already)
  audio_features  HuBERT features of the decoded audio (and with `--emotion auto` the speech-emotion classifier
                  over the same audio: its own seconds are the timings' emotion.seconds)
  motion          conditions and LMDM sampling (the 25 fps motion of the whole clip)
  stitch          each output frame's keypoints: motion mixed into the source, controls, stitching network
  render          fused warp + decode on the device, crops back on the host
  putback         pasting each crop into its background frame
  write           the loop's ffmpeg I/O: handing each frame to the encoder and getting each background
                  frame from the plate decoder (both are ffmpeg pipes, so both waits land here); then the
                  encoder's finish: its last frames, the mux, a delivery's QC of the file, the rename

`stages_cpu` has the same keys: CPU seconds of the loop's own thread in each stage (not torch's or
OpenCV's worker threads, nor ffmpeg), so write's wall minus its CPU is the time spent waiting for ffmpeg.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ditto_fast import models
from ditto_fast.audio.emotion import SpeechEmotion
from ditto_fast.audio.hubert import HubertFeatures
from ditto_fast.delivery.leveling import Leveling, level
from ditto_fast.avatar import Avatar
from ditto_fast.avatar.plate import PlateReader
from ditto_fast.checkpoints import CheckpointSet
from ditto_fast.core.errors import QCError, UsageError
from ditto_fast.core.timing import StageTimer
from ditto_fast.avatar.store import avatar_signature
from ditto_fast.engine.captioning import Captioning, caption_cues, needs_alignment
from ditto_fast.engine.clip import Clip, check_clip
from ditto_fast.engine.emotion_auto import emotion_record, read_emotion, with_auto_emotion
from ditto_fast.engine.request import RenderRequest
from ditto_fast.engine.open_avatars import OpenAvatars
from ditto_fast.engine.measurements import sample_inputs
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.stages import EMOTION, Progress, audio_features, render_frames, sample_motion, timeline
from ditto_fast.media.claims import claimed
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE, rate_text
from ditto_fast.delivery import qc
from ditto_fast.delivery.format import measured_as, programme_chain
from ditto_fast.motion.ddim import DDIMSampler, Denoiser
from ditto_fast.render.fused import FusedRenderer
from ditto_fast.encoding.writer import VideoWriter

STAGES = ("load_models", "load_avatar", "audio_features", "motion", "stitch", "render", "putback", "write")


@dataclass
class RenderResult:
    output: Path
    timings: dict
    mouth: np.ndarray | None = None     # [N] generated lip opening per output frame (for the render preview)
    warnings: tuple[str, ...] = ()      # what the caller should tell the user (speech too quiet to level)
    emotion: np.ndarray | None = None   # [N, 8] `--emotion auto`'s smoothed probabilities per frame (the preview)


def stage_table(timings: dict) -> str:
    """The human-readable stage table of a render's timings."""
    n = max(1, timings["frames"])
    lines = [f"{'stage':<16}{'seconds':>10}{'ms/frame':>11}"]
    for s in STAGES:
        sec = timings["stages"][s]
        lines.append(f"{s:<16}{sec:>10.2f}{1000 * sec / n:>11.1f}")
    lines.append(f"{'total':<16}{timings['wall_seconds']:>10.2f}{1000 * timings['wall_seconds'] / n:>11.1f}")
    lines.append(f"{timings['frames']} frames, {timings['audio_seconds']:.2f} s audio, {timings['fps']:.2f} fps, "
                 f"{timings['device']} {timings['precision']}, {timings['steps']} steps, {timings['rate']} fps "
                 f"{timings['container']} {timings['encoder']}, batch {timings['batch_size']}"
                 + (" — RANDOM WEIGHTS: the face region is noise" if timings["random_weights"] else ""))
    if timings.get("emotion"):
        e, runs = timings["emotion"], []
        for row in e["per_second"]:             # "happy 0-4 s, sad 5-9 s"
            if runs and runs[-1][0] == row["label"]:
                runs[-1][2] = row["second"]
            else:
                runs.append([row["label"], row["second"], row["second"]])
        lines.append(f"emotion auto: {', '.join(f'{lab} {a}-{b} s' if b > a else f'{lab} {a} s' for lab, a, b in runs)}"
                     f" ({e['switches']} switches; classifier {e['seconds']:.2f} s over {e['windows']} windows)"
                     + (" — RANDOM classifier" if e.get("random_weights") else ""))
    if timings.get("delivery"):
        d, ld = timings["delivery"], timings["delivery"].get("loudness")
        level_text = "levels as spoken" if ld is None else (
            f"loudness {ld['input']['integrated_lufs']:.1f} -> {ld['output']['integrated_lufs']:.1f} LUFS "
            f"(target {ld['target']:g}), true peak {ld['output']['true_peak_dbtp']:.1f} dBTP")
        lines.append(f"delivery {d['profile']}: QC {d['qc']}, {level_text}")
    return "\n".join(lines)


class Renderer:
    """Loads the networks and HuBERT once; `render()` then makes one clip per call, again and again.

    Avatars are opened once per name and reopened only when the store's copy was replaced.
    """

    def __init__(self, checkpoints: str | Path | CheckpointSet | None = None, *, options: EngineOptions | None = None,
                 setup: RenderSetup | None = None, **fields: Any):
        """Load the networks for the engine's `options` (or its fields as keywords: Renderer("ckpt", device="cpu");
        checkpoints default to $DITTO_FAST_CHECKPOINTS or ./checkpoints), or for an already resolved `setup`."""
        t0 = time.perf_counter()
        self.setup = setup or RenderSetup.resolve(options or EngineOptions(checkpoints=checkpoints, **fields))
        self.config, self.checkpoints = self.setup.config, self.setup.checkpoints
        self.device, self.dtype = self.setup.device, self.setup.dtype
        files = self.checkpoints.files
        self.lmdm = models.load("lmdm", files["lmdm"], self.device)
        if self.config.motion.overlap >= self.lmdm.seq_len:
            raise UsageError(f"motion.overlap {self.config.motion.overlap} must be below the LMDM's window of "
                             f"{self.lmdm.seq_len} frames")
        self.stitch_net = models.load("stitch_network", files["stitch_network"], "cpu")
        self.fused = FusedRenderer(files["warp_network"], files["decoder"], self.device, self.dtype,
                                   launch=self.setup.launch)
        self.denoise = Denoiser(self.lmdm, self.setup.launch)     # the DDIM step as the engine launches it
        self.hubert = HubertFeatures(self.checkpoints.hubert_dir, device=self.device)
        self.random_weights = self.checkpoints.any_random(self.lmdm, self.stitch_net)
        self._avatars = OpenAvatars(self.checkpoints)
        self._speech_emotion: SpeechEmotion | None = None      # loaded by the first clip that asks for `auto`
        if self.device.type == "cuda":
            self.warm_up()
        self.load_seconds = time.perf_counter() - t0
        self._unreported_load = self.load_seconds      # goes into the first render's timings

    def warm_up(self) -> None:
        """Run each network once at the shapes a render gives it (HuBERT on a second of silence, one LMDM window of
        two DDIM steps, warp + decode twice at the engine's batch size), so that the first clip pays no first-call
        costs: CUDA's modules loaded on first use, cuDNN's and cuBLAS's choices, the allocator's growth, and with
        `launch` graphs the captures (compile: the compiles, minutes). Nothing is kept but those. The constructor
        calls it on CUDA, where it is a few calls of each network; on a CPU warp + decode alone takes seconds a frame
        at full size, more than the first calls cost there."""
        self.hubert.features(np.zeros(SPEECH_SAMPLE_RATE, np.float32))
        lmdm, gen = self.lmdm, torch.Generator(device=self.device).manual_seed(0)
        cond = torch.zeros((1, lmdm.seq_len, lmdm.cond_dim), device=self.device)
        DDIMSampler(lmdm, 2, self.config.motion.guidance, self.denoise)(
            torch.zeros((1, lmdm.motion_dim), device=self.device), cond, gen)
        inputs = sample_inputs(self.fused, self.setup.batch_size)
        for _ in range(2):
            self.fused(*inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def told_load(self) -> float:
        """The seconds the networks took to load, said apart (an engine host says them when it is ready, before any
        job): no render's timings count them then."""
        seconds, self._unreported_load = self._unreported_load, 0.0
        return round(seconds, 3)

    def avatar(self, name: str) -> Avatar:
        """The avatar `name`, opened once and checked against these checkpoints; reopened if replaced since."""
        return self._avatars.get(name)

    def speech_emotion(self) -> SpeechEmotion:
        """The speech-emotion classifier (`--emotion auto`), loaded once on first use; CheckpointError (exit 6)
        naming its folder when the checkpoints have none."""
        if self._speech_emotion is None:
            t0 = time.perf_counter()
            self._speech_emotion = SpeechEmotion.load(self.checkpoints.require_emotion(), device=self.device)
            self._unreported_load += time.perf_counter() - t0
        return self._speech_emotion

    def render(self, clip: RenderRequest | Clip, progress: Progress | None = None,
               commit: Callable[[], None] | None = None) -> RenderResult:
        """Render one clip into its output (written to a temporary name, renamed when complete): a RenderRequest is
        checked first (its avatar opened through this engine), a Clip checked before is rendered as it is (checked
        again, with its decoded audio, against the store's avatar if that was replaced since). `commit` is called
        when the file is complete, just before its rename: an exception there leaves nothing at the output."""
        t_start = time.perf_counter()
        timer = StageTimer(STAGES)
        if isinstance(clip, RenderRequest):
            with timer("load_avatar"):
                avatar = self.avatar(clip.avatar)
            clip = check_clip(clip, avatar, self.config)
        elif avatar_signature(clip.avatar.dir) != clip.avatar_key:     # changed in the store since it was checked
            with timer("load_avatar"):
                avatar = self.avatar(clip.request.avatar)
            clip = check_clip(clip.request, avatar, self.config, audio=clip.audio)
        if clip.emotion_auto is not None:       # before any work: no classifier, no render
            self.speech_emotion()
        timer.seconds["load_models"], self._unreported_load = round(self._unreported_load, 4), 0.0
        digest = self.setup.digest(clip)
        with claimed(clip.output):              # one writer per output path, for the whole render
            mouth, delivery, captions, emotion = self._render(clip, digest, timer, progress, commit)
        wall = time.perf_counter() - t_start
        timings = {
            "frames": clip.frames, "audio_seconds": clip.audio.seconds, "wall_seconds": wall,
            "fps": clip.frames / wall if wall else 0.0, "device": str(self.device),
            "precision": str(self.dtype).replace("torch.", ""), "precision_choice": self.setup.precision_choice,
            "batch_choice": self.setup.batch_choice,
            "steps": clip.steps, "seed": clip.seed,
            "rate": rate_text(clip.rate), "container": clip.format.container, "codec": clip.format.codec, "blend": clip.blend,
            "encoder": self.setup.output_format(clip).encoder, "batch_size": self.setup.batch_size,
            "random_weights": bool(self.random_weights or clip.avatar.random_weights), "output": str(clip.output),
            "digest": digest, "stages": {k: round(v, 4) for k, v in timer.seconds.items()},
            "stages_cpu": {k: round(v, 4) for k, v in timer.thread_seconds.items()},
        }
        warnings: tuple[str, ...] = ()
        if captions is not None:
            timings["captions"] = captions
            warnings = tuple(f"{clip.output}: caption {late['cue']} goes on air at frame {late['shown_frame']}, not "
                             f"{late['cue_frame']}: 608 loads one byte pair a frame; start it later or the one before "
                             "earlier" for late in captions["shown_late"])
        if emotion is not None:
            timings["emotion"] = emotion[0]
        if delivery is not None:
            timings["delivery"] = delivery
            warnings += tuple(f"{clip.output}: {r['name']} {r['measured']}, not {r['expected']} as "
                             f"{clip.delivery.name} asks: levels as spoken (--loudness off); `ditto-fast qc` "
                             "without --loudness off fails it" for r in delivery["requirements"] if r["waived"])
        return RenderResult(clip.output, timings, mouth, warnings=warnings,
                            emotion=emotion[1] if emotion is not None else None)

    def _render(self, clip: Clip, digest: str, timer: StageTimer, progress: Progress | None,
                commit: Callable[[], None] | None
                ) -> tuple[np.ndarray, dict | None, dict | None, tuple[dict, np.ndarray] | None]:
        """The stages of one checked clip; returns the generated lip opening [N] per output frame, for a delivery its
        record (profile, loudness measured in and out, the QC of the file before its rename), for captions theirs,
        for `--emotion auto` its record and smoothed probabilities [N, 8]."""
        avatar, tl = clip.avatar, timeline(clip)
        fmt, leveling, check = self.setup.output_format(clip), None, None
        if clip.delivery is not None:
            if clip.loudness is not None:       # measured once per clip; the motion is made from the speech as is
                programme = ",".join([*clip.soundtrack.filters(), programme_chain(clip.delivery)])
                leveling = level(clip.request.audio, programme, measured_as(clip.delivery), *clip.loudness,
                                 seconds=float(clip.frames / clip.rate))
                if leveling.warning:            # the QC would fail it: refused before any frame
                    raise QCError(f"{leveling.warning}, and {clip.delivery.name} asks {clip.loudness[0]:g} LUFS; "
                                  f"nothing was written to {clip.output}; give audible speech of at least 0.4 s, or "
                                  "--loudness off to deliver it as spoken")
                fmt = dataclasses.replace(fmt, gain=leveling.filters)
            check = _qc_check(clip, fmt)
        # the plate reader is told every frame it will serve, so ffmpeg decodes its first block beside HuBERT and
        # the LMDM, and each next block while one is pasted into
        with PlateReader(avatar.plate_source, avatar.n_frames, is_image=avatar.is_image, pix_fmt="planes",
                         order=tl.src_idx) as plate:
            with timer("audio_features"):
                align = needs_alignment(clip)
                feats, char_logp = audio_features(self.hubert, clip, progress, ctc=True) if align else \
                    (audio_features(self.hubert, clip, progress), None)
                cues = caption_cues(clip, char_logp, self.hubert.model_dir)
                emotion = None
                if clip.emotion_auto is not None:   # the same decoded samples, read for their emotion
                    t0 = time.perf_counter()
                    track, windows = read_emotion(self.speech_emotion(), clip, progress and (
                        lambda done, total: progress(EMOTION, done, total)))
                    clip = with_auto_emotion(clip, track)
                    emotion = (emotion_record(track, windows, time.perf_counter() - t0, self.speech_emotion()),
                               track.probabilities)
            with timer("motion"):
                motion, mouth = sample_motion(self.lmdm, self.config.motion, clip, feats, tl, self.device, progress,
                                              self.denoise)
            del feats
            # the plate's own planes (4:2:0 or 4:2:2, 8 or 10 bits) go to the encoder: only the face box is
            # converted and blended
            with Captioning(clip, cues) if cues is not None else nullcontext() as captioning:
                wfmt = captioning.format(fmt) if captioning else fmt
                embed = (lambda path: captioning.embed_into(path, wfmt)) if captioning else None
                with VideoWriter(clip.output, avatar.size, fps=clip.rate, audio_path=clip.request.audio,
                                 crf=self.setup.crf, preset=self.setup.preset, comment=digest, frames=clip.frames,
                                 fmt=wfmt, pix_fmt=plate.layout.pix_fmt, soundtrack=clip.soundtrack,
                                 check=_before_rename(check, commit, embed),
                                 threads=self.setup.encoder_threads) as writer:
                    render_frames(clip, motion, tl, self.stitch_net, self.fused, self.setup.batch_size,
                                  self.config.render.lookahead, plate, writer, timer, progress,
                                  self.setup.output_stage)
                    with timer("write"):        # the encoder's last frames, the mux (the captions, the QC), the rename
                        writer.close()
                if captioning:
                    captioning.write_sidecars()
        record = captioning.record() if captioning else None
        if clip.delivery is None:
            return mouth, None, record, emotion
        return mouth, _delivery_record(clip, leveling, writer.checked), record, emotion


def _before_rename(check: Callable[[Path], list] | None, commit: Callable[[], None] | None,
                   embed: Callable[[Path], None] | None = None) -> Callable[[Path], list | None] | None:
    """What the writer runs on the finished temporary file before its rename: the captions embedded, the delivery's
    QC, then `commit`."""
    if commit is None and embed is None:
        return check

    def run(path: Path) -> list | None:
        if embed is not None:
            embed(path)
        checked = check(path) if check else None
        if commit is not None:
            commit()
        return checked
    return run


def _qc_check(clip: Clip, fmt) -> Callable[[Path], list]:
    """The QC a delivery's finished temporary file must pass before it is renamed into place (QCError if not): the
    one `ditto-fast qc --delivery NAME` runs, with the render's --loudness and --timecode (off: the loudness lines
    are notes)."""
    def check(path: Path) -> list:
        return qc.require(path, clip.delivery, clip.output, size=fmt.size, rate=fmt.rate, timecode=fmt.timecode,
                          loudness=qc.loudness_wanted(clip.delivery, clip.request.loudness),
                          captions=bool(clip.captions and clip.captions.embed))
    return check


def _delivery_record(clip: Clip, leveling: Leveling | None, checked: list) -> dict:
    """The timings JSON's "delivery": the profile, the QC lines, loudness measured on the speech and on the file."""
    v = clip.delivery.video
    record = {"profile": clip.delivery.name, "qc": qc.summary(checked),
              "scan": ("interlaced " + v.field_order + (", field-rate motion" if v.field_rate else ", PsF"))
              if v.interlaced else "progressive", "delivered_rate": rate_text(clip.format.rate),
              "requirements": qc.as_json(checked), "loudness": None}
    if leveling is not None:
        measured = {r.name: r.measured for r in checked}
        out = {"integrated_lufs": float(measured["loudness"].split()[0]),
               "true_peak_dbtp": float(measured["true peak"].split()[0])} if "loudness" in measured else \
            leveling.measured_out.as_dict()
        record["loudness"] = {"target": clip.loudness[0], "ceiling": clip.loudness[1], **leveling.as_dict(),
                              "output": out}
    return record
