"""`ditto-fast register`: source -> landmarks -> steady crops -> extractor features -> avatar cache.

One streaming pass over the frames. The crop of frame i is built from crop parameters smoothed over
frames [i-h, i+h], so frames wait in a short queue (h+1 frames) until their look-ahead has been
tracked; nothing else is kept per frame except landmarks-sized arrays.
"""

from __future__ import annotations

import errno
import os
import warnings
from collections import deque
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import torch

from ditto_fast import models
from ditto_fast.checkpoints import find_checkpoints
from ditto_fast.core.config import RegisterConfig, load_config
from ditto_fast.core.devices import numpy_blas_single_threaded, resolve_device
from ditto_fast.core.errors import InputError, NoFaceError
from ditto_fast.core.keypoint_info import X_S_INFO_KEYS
from ditto_fast.face.crop import DSIZE, crop_params, landmarks_in_crop, params_to_matrix, smooth_params, warp_crop
from ditto_fast.face.eyes import eye_features
from ditto_fast.face.kept_points import KEPT_POINTS, kept_points
from ditto_fast.face.landmarks import FaceTracker, choice_text, import_mediapipe
from ditto_fast.face.mouth import mouth_openness
from ditto_fast.core.memory import release_free_memory
from ditto_fast.media.rates import rate_text
from ditto_fast.core.smoothing import centred_mean
from ditto_fast.core.timing import StageTimer
from ditto_fast.media.yuv import YuvFrame
from ditto_fast.avatar.format import F_S_DTYPE, AvatarRecord
from ditto_fast.media.inputs import file_sha256
from ditto_fast.avatar.mouth_check import MouthCheck
from ditto_fast.avatar.plate import write_plate_image
from ditto_fast.avatar.plate_copy import PlatePlan, copy_refusal, plan_plate
from ditto_fast.avatar.source import SourceFrames, SourceInfo, open_source
from ditto_fast.avatar.store import avatars_dir, validate_name
from ditto_fast.avatar.writer import AvatarWriter

_MAX_FRAMES = 10**8          # no real limit: f_s grows with the frames read
TRIM_EVERY = 100             # frames between returns of the heap's free pages to the OS (see memory.py)
Step = Callable[..., object]
ProgressFactory = Callable[[int, str], Step]


class Extractors:
    """Appearance and motion extractors on one device: batches of 256x256 crops -> f_s and x_s_info."""

    def __init__(self, files: dict[str, Path], device: torch.device):
        self.device = device
        self.appearance = models.load("appearance_extractor", files["appearance_extractor"], device)
        self.motion = models.load("motion_extractor", files["motion_extractor"], device)

    @property
    def f_s_row_bytes(self) -> int:
        """Bytes of one frame's f_s row in the cache (float16 [C, D, H, W] for a 256x256 crop)."""
        net = self.appearance
        side = 256 >> len(net.down_blocks)
        return net.reshape_channel * net.reshape_depth * side * side * F_S_DTYPE.itemsize

    @torch.inference_mode()
    def __call__(self, crops256: np.ndarray) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        """f_s [B,C,D,64,64] (a tensor on the device) and x_s_info arrays for a batch of crops [B,256,256,3]."""
        x = torch.from_numpy(crops256).to(self.device).permute(0, 3, 1, 2).float() / 255.0  # [B,3,256,256]
        f_s = self.appearance(x)
        out = self.motion(x)
        return f_s, {k: out[k].float().cpu().numpy() for k in X_S_INFO_KEYS}


class _FeatureSink:
    """Collects 256x256 crops into batches, runs the extractors, writes f_s rows and keeps x_s_info."""

    def __init__(self, nets: Extractors, writer: AvatarWriter, n_cap: int, batch_size: int, step: Step,
                 timer: StageTimer):
        self.nets, self.writer, self.n_cap, self.batch_size = nets, writer, n_cap, batch_size
        self.step, self.timer = step, timer
        self.batch: list[np.ndarray] = []
        self.done = 0
        self.infos: dict[str, list[np.ndarray]] = {k: [] for k in X_S_INFO_KEYS}

    def add(self, crop256: np.ndarray) -> None:
        self.batch.append(crop256)
        if len(self.batch) == self.batch_size:
            self.flush()

    def flush(self) -> None:
        if not self.batch:
            return
        with self.timer("networks"):
            f_s, info = self.nets(np.stack(self.batch))
            if self.done == 0:
                self.writer.open_f_s(self.n_cap, tuple(f_s.shape[1:]))
            rows = self.writer.f_s_buffer(len(f_s))
            torch.from_numpy(rows).copy_(f_s)      # to the host as float16, straight into the write buffer
        with self.timer("cache_write"):
            self.writer.write_f_s(self.done, rows)
        for k in X_S_INFO_KEYS:
            self.infos[k].append(info[k])
        if self.done // TRIM_EVERY != (self.done + len(self.batch)) // TRIM_EVERY:
            release_free_memory()
        self.done += len(self.batch)
        self.step(len(self.batch))
        self.batch = []

    def x_s_info(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v, 0).astype(np.float32) for k, v in self.infos.items()}


class _Crops:
    """Tracked frames waiting for their look-ahead: frame i is cropped with crop parameters smoothed over frames
    [i-h, i+h] once those are tracked, and its crop goes to the feature sink. What the record keeps of each frame
    (crop parameters, eyes, mouth, kept landmarks) is collected here."""

    def __init__(self, window: int, sink: _FeatureSink, timer: StageTimer):
        self.window, self.half = window, max(1, window) // 2
        self.sink, self.timer = sink, timer
        self.params: list[np.ndarray] = []          # raw crop parameters per frame [4]
        self.smoothed: list[np.ndarray] = []        # the crop parameters as used
        self.eye_open: list[np.ndarray] = []
        self.eye_ball: list[np.ndarray] = []
        self.mouth: list[float] = []                # inner-lip gap / mouth width per frame
        self.points: list[np.ndarray] = []          # the kept landmarks [K, 2] in crop pixels, per frame
        self.queue: deque[tuple[int, np.ndarray | YuvFrame, np.ndarray]] = deque()    # (index, frame, landmarks)

    def add(self, i: int, frame: np.ndarray | YuvFrame, lmk: np.ndarray, params: np.ndarray) -> None:
        """Queue frame i with its landmarks and raw crop parameters; crop the frames whose look-ahead is complete."""
        self.params.append(params)
        self.queue.append((i, frame, lmk))
        self.emit(ending=False)

    def emit(self, ending: bool) -> None:
        """Crop and featurize queued frames whose look-ahead window is complete (all of them when ending)."""
        half, params = self.half, self.params
        while self.queue and (ending or self.queue[0][0] + half < len(params)):
            i, frame, lmk = self.queue.popleft()
            with self.timer("crop_eyes"):
                lo, hi = max(0, i - half), min(len(params), i + half + 1)
                p = smooth_params(np.stack(params[lo:hi]), self.window)[i - lo] if hi - lo > 1 else params[i]
                self.smoothed.append(p)
                M = params_to_matrix(p, DSIZE)
                crop512 = warp_crop(frame, M, DSIZE)
                in_crop = landmarks_in_crop(lmk, M, DSIZE)
                eo, eb = eye_features(in_crop[None])
                self.eye_open.append(eo[0])
                self.eye_ball.append(eb[0])
                self.mouth.append(float(mouth_openness(in_crop[None])[0]))
                self.points.append(kept_points(in_crop, DSIZE))
                crop256 = cv2.resize(crop512, (256, 256), interpolation=cv2.INTER_AREA)
            self.sink.add(crop256)


def source_statistics(raw: dict[str, np.ndarray], window: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per-frame x_s_info smoothed over `window` frames (cut at the ends, as Ditto) and the shape code
    `sc` [63]: frame 0's keypoints as extracted, before smoothing."""
    return {k: centred_mean(v, window) for k, v in raw.items()}, raw["kp"][0].reshape(-1).copy()


def estimate_plate_bytes(info: SourceInfo) -> int:
    """About how large the plate will be: the source's own size where its stream is copied, half its frames
    uncompressed where the plate is encoded (lossless H.264 kept a grainy 720p clip in a third), an uncompressed
    RGB frame for an image."""
    tw, th = info.size
    if info.is_image:
        return tw * th * 3
    if copy_refusal(info) is None:
        return info.path.stat().st_size
    layout = info.picture.plate_layout
    rows, cols = layout.shape(tw, th)
    return info.est_frames * rows * cols * np.dtype(layout.dtype).itemsize // 2


def check_free_space(where: Path, name: str, frames: int, row_bytes: int, plate_bytes: int) -> None:
    """InputError before any work if the avatar (frames x an f_s row, the plate) cannot fit in `where`'s disk."""
    need = frames * row_bytes + plate_bytes + (1 << 20)      # + the record and slack
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise InputError(f"{where.parent}: not enough free space for avatar '{name}': it needs about "
                         f"{need / 2**20:,.0f} MiB ({frames} frames x {row_bytes / 2**20:.2f} MiB of features + the "
                         f"plate), {free / 2**20:,.0f} MiB are free; free some space, register fewer frames "
                         "(--max-frames), or set DITTO_FAST_HOME to a bigger disk")


def faces_note(source: Path, choices: list[tuple[int, list[np.ndarray], np.ndarray, str]]) -> str:
    """The note for a source showing several faces: which face was taken, its box, and how to pick another."""
    first = choice_text(*choices[0])
    later = [str(c[0]) for c in choices[1:]]
    more = (f"; {len(later)} later detection{'s' if len(later) > 1 else ''} (after the face was lost) also found "
            f"several, at frame{'s' if len(later) > 1 else ''} {', '.join(later[:8])}{', ...' if len(later) > 8 else ''}"
            if later else "")
    return f"{source}: {first}{more}; choose the face with --face largest|left|right|N (N counted from the left)"


def _no_progress(total: int, label: str) -> Step:
    return lambda n=1: None


class Registrar:
    """Registration with the appearance and motion extractors loaded once (on the first `register()`)."""

    def __init__(self, checkpoints: str | Path | None = None, device: str = "auto",
                 config: RegisterConfig | None = None):
        import_mediapipe()           # a render-only install stops here, before anything else, naming the install
        self.config = config or load_config().register
        self.checkpoints = find_checkpoints(checkpoints, need_hubert=False,
                                            networks=("appearance_extractor", "motion_extractor"))
        self.device = resolve_device(device)
        self._nets: Extractors | None = None
        self.notes: list[str] = []      # what the last register() wants the user told (e.g. a rate it chose)
        self.warnings: list[str] = []   # what the user should fix in the source (e.g. an open mouth)

    def _extractors(self) -> Extractors:
        if self._nets is None:
            self._nets = Extractors(self.checkpoints.files, self.device)
        return self._nets

    def register(self, source: str | Path, name: str | None = None, *, max_size: int | None = None,
                 max_frames: int | None = None, force: bool = False, batch_size: int | None = None,
                 progress: ProgressFactory | None = None, timer: StageTimer | None = None,
                 strict: bool = False, source_colour: str | None = None, face: str | int | None = None) -> Path:
        """Register an anchor video or image; returns the avatar directory (appears only when complete).

        `face` (default config.face, "largest"): the face taken where several are found: largest, left, right or
        N (1 = the leftmost); which one was taken, and where, is added to `notes`.

        A source whose mouth is open (frame 0, or more than config.mouth_open_share of the frames) adds a
        line to `warnings`; with `strict` it is refused (NoFaceError) and nothing is written.

        `timer` collects seconds for the stages decode, landmarks, crop_eyes, networks, plate_write,
        cache_write. A video is decoded once, by one ffmpeg process that also encodes the plate (or, where the plate
        is the source's own stream copied, sums each frame to check the copy by); plate_write is the wait for that
        process to finish after the last frame, and the check of a copy.
        """
        cfg = self.config
        timer = timer or StageTimer()
        max_size = max_size or cfg.max_size
        batch_size = batch_size or cfg.batch_size
        source = Path(source)
        name = validate_name(name if name is not None else source.stem)
        info, image = open_source(source, max_size, source_colour or cfg.source_colour)
        self.notes = [f"{source}: {info.rate_note}"] if info.rate_note else []
        if not info.is_image:
            self.notes += info.picture.notes(source, info.src_size, info.size, max_size)
        self.warnings = []
        try:
            return self._register(source, name, info, image, max_frames, force, batch_size, progress, timer, strict,
                                  face if face is not None else cfg.face)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise InputError(f"no space left on the disk of {avatars_dir()} while writing the avatar '{name}' "
                             "(nothing was kept); free some space or set DITTO_FAST_HOME to a bigger disk") from None

    def _register(self, source: Path, name: str, info: SourceInfo, image: np.ndarray | None,
                  max_frames: int | None, force: bool, batch_size: int, progress: ProgressFactory | None,
                  timer: StageTimer, strict: bool = False, face: str | int = "largest") -> Path:
        """The streaming pass over an opened source (see register())."""
        cfg, cs = self.config, self.checkpoints
        # frames expected (for the progress bar; a video's duration is only an estimate) and allowed
        n_est = 1 if info.is_image else info.est_frames
        n_cap = 1 if info.is_image else (max_frames if max_frames is not None else _MAX_FRAMES)
        if max_frames is not None:
            n_est = min(n_est, max_frames)
        with AvatarWriter(name, force=force) as writer, ExitStack() as stack:   # name/store checked first
            stack.enter_context(numpy_blas_single_threaded())
            nets = self._extractors()
            check_free_space(writer.tmp_dir, name, n_est, nets.f_s_row_bytes, estimate_plate_bytes(info))
            sink = _FeatureSink(nets, writer, n_cap, batch_size, (progress or _no_progress)(n_est, "register"), timer)
            crops = _Crops(cfg.crop_smooth_window, sink, timer)
            tracker = stack.enter_context(FaceTracker(min_face_px=cfg.min_face_px, source=str(source), face=face))
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
            plate = writer.plate_path(info.is_image)
            made: PlatePlan | None = None
            if info.is_image:
                write_plate_image(image, plate)
                reader = None
            else:
                made = plan_plate(info, plate, max_frames)      # the source's own stream, copied, where it can be
                # frames alive at once: the queue (at most half + 1) and the one being read; ffmpeg may
                # decode the next batch while the networks run on this one
                reader = stack.enter_context(SourceFrames(info, max_frames, ring=crops.half + 3, plate=made.encode_to,
                                                          ahead=batch_size + 2, frame_sums=made.sums))
            self._track(source, image, reader, tracker, crops, timer)
            if made is not None:
                with timer("plate_write"):                      # a copy read back against the frames read
                    note = made.finish(info, len(crops.params))
                self.notes += [note] if note else []
            mouth = self._check_mouth(source, crops.mouth, strict)
            warned = sorted({str(w.message) for w in caught} | ({info.rate_note} if info.rate_note else set())
                            | set(self.warnings))
            record = avatar_record(source, info, cfg, crops, sink.x_s_info(), fingerprints=cs.avatar_fingerprints(),
                                   random_weights=cs.any_random(nets.appearance, nets.motion), mouth=mouth,
                                   warned=warned, plate=made.how if made else "the image, as PNG")
            with timer("cache_write"):
                writer.finish(record)
        return writer.final_dir

    def _track(self, source: Path, image: np.ndarray | None, reader: SourceFrames | None, tracker: FaceTracker,
               crops: _Crops, timer: StageTimer) -> None:
        """Find the face in every frame (the image, or the reader's) and crop each; the features follow in crops'
        sink."""
        cfg = self.config
        frames = iter([image]) if reader is None else iter(reader)
        for i, frame in enumerate(timer.iterate(frames, "decode")):
            with timer("landmarks"):
                lmk = tracker(frame, i).astype(np.float32)
                params = np.asarray(crop_params(lmk, cfg.crop_scale, cfg.crop_vx, cfg.crop_vy), np.float64)
            crops.add(i, frame, lmk, params)
        if reader is not None:
            with timer("plate_write"):
                reader.finish()
        if not crops.params:
            raise InputError(f"{source}: the video has no frames; re-export it")
        if tracker.face_choices:
            self.notes.append(faces_note(source, tracker.face_choices))
        crops.emit(ending=True)
        crops.sink.flush()

    def _check_mouth(self, source: Path, openness: list[float], strict: bool) -> MouthCheck:
        """The mouth check of the frames' openness: a line in `warnings` if the mouth is open (refused if strict)."""
        cfg = self.config
        check = MouthCheck(np.asarray(openness, np.float32), cfg.mouth_open_threshold, cfg.mouth_open_share)
        if check.flagged:
            if strict:
                raise NoFaceError(f"{check.message(str(source))}; refused (--strict): register a take where the "
                                  "mouth is closed")
            self.warnings.append(f"{check.message(str(source))}; register a take where the mouth is closed "
                                 "(--strict refuses such sources)")
        return check


def avatar_record(source: Path, info: SourceInfo, cfg: RegisterConfig, crops: _Crops, raw_info: dict[str, np.ndarray],
                  *, fingerprints: dict[str, str], random_weights: bool, mouth: MouthCheck,
                  warned: list[str], plate: str) -> AvatarRecord:
    """The record of a registered source: what was measured of each of its frames, and how."""
    n = len(crops.params)
    params = np.stack(crops.smoothed)                      # [N, 4] the crop parameters as used
    x_s_info, sc = source_statistics(raw_info, cfg.info_smooth_window)
    picture = {} if info.is_image else {"picture": info.picture.record()}
    return AvatarRecord(
        is_image=info.is_image, fps=float(info.rate), rate=rate_text(info.rate), size=info.size,
        source={"path": str(source.resolve()), "sha256": file_sha256(source), "fps": info.src_fps,
                "size": list(info.size), "source_size": list(info.src_size), "frames": n, **picture, "plate": plate},
        fingerprints=fingerprints, random_weights=random_weights,
        crop={"dsize": DSIZE, "scale": cfg.crop_scale, "vx": cfg.crop_vx, "vy": cfg.crop_vy,
              "smooth_window": cfg.crop_smooth_window, "params": params},
        x_s_info=x_s_info, M_c2o=np.asarray(params_to_matrix(params, DSIZE), np.float64).reshape(n, 3, 3),
        eye_open=np.stack(crops.eye_open).astype(np.float32), eye_ball=np.stack(crops.eye_ball).astype(np.float32),
        sc=sc,
        extra={"registered": datetime.now(timezone.utc).isoformat(timespec="seconds"), "warnings": warned,
               "mouth": mouth.record(),
               "landmarks": {"index": KEPT_POINTS.copy(), "crop_xy": np.stack(crops.points)}},  # [K], [N, K, 2] f16
    )


def register_avatar(source: str | Path, name: str | None = None, max_size: int | None = None,
                    max_frames: int | None = None, force: bool = False, checkpoints: str | Path | None = None,
                    device: str = "auto", batch_size: int | None = None, progress: ProgressFactory | None = None,
                    timer: StageTimer | None = None, config: RegisterConfig | None = None,
                    strict: bool = False, source_colour: str | None = None,
                    face: str | int | None = None) -> Path:
    """Register one source with a fresh Registrar (see Registrar.register)."""
    return Registrar(checkpoints, device, config).register(source, name, max_size=max_size, max_frames=max_frames,
                                                           force=force, batch_size=batch_size, progress=progress,
                                                           timer=timer, strict=strict, source_colour=source_colour,
                                                           face=face)
