"""The stages of one clip's render, in the timings' order: the timeline, audio features, motion, then the frame
loop (stitch, warp + decode, putback, write). Each is a function of the checked Clip and what came before;
the Renderer wires them, owns the timer and hands progress on: each long stage reports (stage, done, total)
from its start, so an hour of audio shows movement in its first second."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np
import torch

from ditto_fast.audio.decode import frame_count
from ditto_fast.audio.hubert import HubertFeatures
from ditto_fast.avatar.plate import PlateReader
from ditto_fast.core.config import MotionConfig
from ditto_fast.core.timing import StageTimer
from ditto_fast.engine.clip import Clip
from ditto_fast.media.rates import MOTION_FPS
from ditto_fast.media.timeline import mirror_positions, motion_timeline, source_indices
from ditto_fast.motion.conditions import build_conditions, condition_parts
from ditto_fast.motion.ddim import DDIMSampler, Denoiser
from ditto_fast.motion.keypoints import info_to_motion, motion_to_info
from ditto_fast.motion.lips import lip_opening
from ditto_fast.motion.sampling import MotionSampler
from ditto_fast.motion.stitch import MotionStitch
from ditto_fast.render.fused import FusedRenderer
from ditto_fast.render.putback import YuvPutback
from ditto_fast.encoding.writer import VideoWriter

# (stage, done, total): AUDIO_FEATURES and MOTION count the clip's 25 fps motion frames, FRAMES its output frames,
# EMOTION (`--emotion auto` only, after AUDIO_FEATURES) the speech-emotion classifier's windows
Progress = Callable[[str, int, int], None]
AUDIO_FEATURES, MOTION, FRAMES, EMOTION = "audio features", "motion", "frames", "emotion"


def _for(progress: Progress | None, stage: str) -> Callable[[int, int], None] | None:
    """A stage's own (done, total) callback reporting to `progress` under the stage's name."""
    return None if progress is None else (lambda done, total: progress(stage, done, total))


@dataclass(frozen=True)
class Timeline:
    """Where each frame of the clip stands: motion is made at 25 fps, output frame i (time i / rate) blends the two
    motion frames around its time and shows the source frame at that time (mirror-looped), so nothing drifts."""

    src_idx: np.ndarray                 # [N] the source frame shown at each output frame
    motion_src: np.ndarray              # [M] the source frame at each motion frame (for the eye conditions)
    emo_rows: np.ndarray                # [M] the output frame at each motion frame's time (emotion schedules)
    j0: np.ndarray                      # [N] the motion frames around each output frame's time ...
    j1: np.ndarray
    w: np.ndarray                       # [N] ... and how far between them it lies


def timeline(clip: Clip) -> Timeline:
    """The clip's frames on the 25 fps motion timeline and on its avatar's source frames."""
    avatar, n = clip.avatar, clip.frames
    n_motion = frame_count(len(clip.audio.samples))
    src_idx = mirror_positions(source_indices(n, clip.rate, avatar.rate), avatar.n_frames)
    motion_src = mirror_positions(source_indices(n_motion, Fraction(MOTION_FPS), avatar.rate), avatar.n_frames)
    emo_rows = np.minimum(source_indices(n_motion, Fraction(MOTION_FPS), clip.rate), n - 1)
    return Timeline(src_idx, motion_src, emo_rows, *motion_timeline(n, clip.rate, n_motion))


def audio_features(hubert: HubertFeatures, clip: Clip, progress: Progress | None = None, ctc: bool = False):
    """HuBERT features of the clip's audio: [M, 1024] at 25 fps; with `ctc`, (features, the character head's
    log-probabilities [2M, vocab] at 50 Hz) from the same pass (a script to time)."""
    return hubert.features(clip.audio.samples, progress=_for(progress, AUDIO_FEATURES), ctc=ctc)


def sample_motion(lmdm: torch.nn.Module, settings: MotionConfig, clip: Clip, feats: np.ndarray, tl: Timeline,
                  device: torch.device, progress: Progress | None = None, denoise: Denoiser | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The clip's motion [M, 265] at 25 fps from its conditions, and the generated lip opening [N] per output frame;
    `denoise`: the engine's DDIM step as it launches it (None: the network called as it is)."""
    avatar = clip.avatar
    parts = condition_parts(lmdm.cond_dim, feats.shape[1])
    cond = build_conditions(feats, parts, clip.emotion[tl.emo_rows], avatar.eye_open, avatar.eye_ball, avatar.sc,
                            src_idx=tl.motion_src)
    gen = torch.Generator(device=device).manual_seed(clip.seed)
    sampler = MotionSampler(DDIMSampler(lmdm, clip.steps, settings.guidance, denoise), window=lmdm.seq_len,
                            overlap=settings.overlap, smooth_window=settings.smooth_window, device=device)
    motion = sampler(cond, info_to_motion(avatar.frame_info(0)), gen, _for(progress, MOTION))   # [M, 265]
    lips = lip_opening(motion, avatar.sc)                                        # [M] at 25 fps
    mouth = lips[tl.j0] + tl.w.astype(np.float32) * (lips[tl.j1] - lips[tl.j0])  # [N] at the output rate
    return motion, mouth


def plate_jumps(src_idx: np.ndarray) -> np.ndarray:
    """[N] bool: where the plate does not simply go on (a jump, or the mirror loop turning back): running means
    over frames (the seam's) start afresh there. An image avatar's one frame never jumps."""
    src = np.asarray(src_idx, np.int64)
    step = np.diff(src, prepend=src[:1])
    sign = np.sign(step)
    last = np.maximum.accumulate(np.where(sign != 0, np.arange(len(src)), -1))    # last move up to each frame
    before = np.r_[-1, last[:-1]]
    heading = np.where(before >= 0, sign[np.maximum(before, 0)], 0)               # the way it went before
    return (np.abs(step) > 1) | (sign * heading < 0)


def render_frames(clip: Clip, motion: np.ndarray, tl: Timeline, stitch_net: torch.nn.Module, fused: FusedRenderer,
                  batch_size: int, lookahead: bool, plate: PlateReader, writer: VideoWriter, timer: StageTimer,
                  progress: Progress | None, output_stage: str = "inline") -> None:
    """The frame loop: each micro-batch stitched and launched, then collected, pasted into its background frames
    and written, in order. With `lookahead` batch k+1 is launched before batch k is pasted and written, so a GPU
    computes while this thread works; with `output_stage` "thread" the pasting and writing run on a thread of their
    own (OutputStage), so the networks never wait for them. The output is the same either way."""
    avatar, n = clip.avatar, clip.frames
    stitch = MotionStitch(stitch_net, is_image=avatar.is_image, controls=clip.controls)
    putback = YuvPutback(layout=plate.layout, blend=clip.blend)
    batches = [range(b0, min(n, b0 + batch_size)) for b0 in range(0, n, batch_size)]
    cuts = plate_jumps(tl.src_idx[:n])
    threaded = output_stage == "thread"

    def launch(idx: range):
        """Stitch a batch's keypoints (all its frames at once) and start its warp + decode."""
        rows = slice(idx.start, idx.stop)
        src = tl.src_idx[rows]                               # the source frame of each output frame
        with timer("stitch"):
            x_s, x_d = stitch.batch(avatar.frame_infos(src), motion_to_info(motion[tl.j0[rows]]),
                                    motion_to_info(motion[tl.j1[rows]]), tl.w[rows])
        with timer("render"):
            return fused.launch(avatar.features(src), x_s, x_d), np.asarray(x_s), np.asarray(x_d)

    def paste_and_write(idx: range, crops: np.ndarray, x_s: np.ndarray, x_d: np.ndarray) -> None:
        """Each frame of a collected batch pasted into its background frame and handed to the encoder."""
        for j, i in enumerate(idx):
            with timer("write"):                 # ffmpeg I/O: the plate decoder here, the encoder below
                background = plate.frame(int(tl.src_idx[i]))
            with timer("putback"):
                frame = putback(background, crops[j], avatar.M_c2o[tl.src_idx[i]], x_s[j], x_d[j], bool(cuts[i]))
            with timer("write"):
                writer.write(frame)

    if progress is not None:
        progress(FRAMES, 0, n)
    with OutputStage(paste_and_write, threaded, timer) as output:
        pending = launch(batches[0]) if batches else None
        for k, idx in enumerate(batches):
            following = batches[k + 1] if k + 1 < len(batches) else None
            after = launch(following) if lookahead and following else None
            handle, x_s, x_d = pending
            with timer("render"):
                crops = fused.collect(handle, keep=threaded)    # uint8 [b,512,512,3]
            output.put(idx, crops, x_s, x_d)
            if progress is not None:
                progress(FRAMES, idx.stop, n)
            pending = after if lookahead else (launch(following) if following else None)


class OutputStage:
    """A render's putback and hand-off to the encoder, `work(*batch)` for each collected batch in order: on the
    caller's thread (inline), or on a thread of its own (threaded) fed through a queue of `depth` batches, so the
    frame loop goes on stitching and launching meanwhile. Used as a context: leaving it normally waits for the last
    batch and raises what the thread raised; leaving it with an exception (a cancel, an error of the loop) stops the
    thread after the batch it is on, so the caller's cleanup (the writer's abort) never races it. The threaded stage
    times its waits for a free place in the queue as `handoff` (the loop waiting for the output)."""

    _END = None

    def __init__(self, work: Callable[..., None], threaded: bool, timer: StageTimer, depth: int = 2):
        self.work, self.threaded, self.timer = work, threaded, timer
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="ditto-fast-output", daemon=True) if threaded else None

    def __enter__(self) -> "OutputStage":
        if self._thread is not None:
            self._thread.start()
        return self

    def put(self, *batch) -> None:
        """Hand one batch on (inline: done now); raises the output thread's error once it has failed."""
        if self._thread is None:
            self.work(*batch)
            return
        self._raise()
        with self.timer("handoff"):
            while True:
                try:
                    self._queue.put(batch, timeout=0.1)
                    break
                except queue.Full:
                    self._raise()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is self._END or self._stop.is_set():
                return
            try:
                self.work(*batch)
            except BaseException as e:  # noqa: BLE001 - raised again in the frame loop's thread
                self.error = e
                return

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def __exit__(self, kind, value, tb) -> None:
        if self._thread is None:
            return
        if kind is not None:
            self._stop.set()
        while self._thread.is_alive():       # the end mark goes in once there is room (a failed thread takes none)
            try:
                self._queue.put(self._END, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join()
        if kind is None:
            self._raise()
