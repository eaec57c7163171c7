"""`ditto-fast register`: source -> landmarks -> steady crops -> extractor features -> avatar cache."""

from __future__ import annotations

import hashlib
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import cv2
import numpy as np
import torch

from .. import models
from ..checkpoints import find_checkpoints
from ..devices import resolve_device
from ..errors import InputError
from ..face.crop import crop_params, landmarks_in_crop, params_to_matrix, smooth_params, warp_crop
from ..face.eyes import eye_features
from ..face.landmarks import FaceTracker
from ..motion.sampling import centered_mean
from ..render.plate import open_plate_writer, write_plate_image
from .cache import AvatarWriter, validate_name
from .source import SourceInfo, iter_frames, open_source

INFO_KEYS = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")
Step = Callable[..., object]
ProgressFactory = Callable[[int, str], Step]


class Extractors:
    """Appearance and motion extractors on one device: batches of 256x256 crops -> f_s and x_s_info."""

    def __init__(self, files: dict[str, Path], device: torch.device):
        self.device = device
        self.appearance = models.load("appearance_extractor", files["appearance_extractor"], device)
        self.motion = models.load("motion_extractor", files["motion_extractor"], device)
        self.random_weights = any(getattr(m, "ditto_meta", {}).get("random_weights")
                                  for m in (self.appearance, self.motion))

    @torch.inference_mode()
    def __call__(self, crops256: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        x = torch.from_numpy(crops256).to(self.device).permute(0, 3, 1, 2).float() / 255.0  # [B,3,256,256]
        f_s = self.appearance(x).to(torch.float16).cpu().numpy()                          # [B,C,D,64,64]
        out = self.motion(x)
        return f_s, {k: out[k].float().cpu().numpy() for k in INFO_KEYS}


def _no_progress(total: int, label: str) -> Step:
    return lambda n=1: None


def _landmark_pass(frames: Iterator[np.ndarray], source: Path, min_face_px: int, step: Step
                   ) -> tuple[list[np.ndarray], list[str]]:
    """Landmarks [478,3] for every frame (streamed); also the warnings raised (e.g. several faces)."""
    lmks: list[np.ndarray] = []
    with FaceTracker(min_face_px=min_face_px, source=str(source)) as tracker, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, frame in enumerate(frames):
            lmks.append(tracker(frame, i).astype(np.float32))
            step(1)
    return lmks, sorted({str(w.message) for w in caught})


def _feature_pass(frames: Iterator[np.ndarray], n: int, M_c2o: np.ndarray, lmks: list[np.ndarray],
                  nets: Extractors, writer: AvatarWriter, batch_size: int, step: Step) -> dict[str, np.ndarray]:
    """Crops -> eye features, f_s (written to the memory map batch by batch) and raw x_s_info."""
    eye_open = np.zeros((n, 2), np.float32)
    eye_ball = np.zeros((n, 6), np.float32)
    infos: dict[str, list[np.ndarray]] = {k: [] for k in INFO_KEYS}
    batch: list[np.ndarray] = []
    done = 0
    for i, frame in enumerate(frames):
        if i >= n:
            break
        crop512 = warp_crop(frame, M_c2o[i], 512)
        batch.append(cv2.resize(crop512, (256, 256), interpolation=cv2.INTER_AREA))
        eo, eb = eye_features(landmarks_in_crop(lmks[i], M_c2o[i], 512)[None])
        eye_open[i], eye_ball[i] = eo[0], eb[0]
        if len(batch) == batch_size or i == n - 1:
            f_s, info = nets(np.stack(batch))
            if done == 0:
                writer.open_f_s(n, f_s.shape[1:])
            writer.write_f_s(done, f_s)
            for k in INFO_KEYS:
                infos[k].append(info[k])
            done += len(batch)
            step(len(batch))
            batch = []
    if done != n:
        raise InputError(f"the source gave {done} frames on the second read, {n} on the first; "
                         "it may have changed while registering; retry")
    out = {k: np.concatenate(v, 0).astype(np.float32) for k, v in infos.items()}
    out["eye_open"], out["eye_ball"] = eye_open, eye_ball
    return out


def _frames(info: SourceInfo, image: np.ndarray | None, max_frames: int | None) -> Iterator[np.ndarray]:
    return iter([image]) if info.is_image else iter_frames(info, max_frames)


def _teeing(frames: Iterator[np.ndarray], plate_writer) -> Iterator[np.ndarray]:
    for f in frames:
        plate_writer.write(f)
        yield f


def register_avatar(source: str | Path, name: str | None = None, max_size: int = 1920,
                    max_frames: int | None = None, force: bool = False, checkpoints: str | Path | None = None,
                    device: str = "auto", batch_size: int = 8, landmarks: str = "mediapipe",
                    progress: ProgressFactory | None = None,
                    smooth_crop: int = 13, smooth_info: int = 13, min_face_px: int = 64) -> Path:
    """Register an anchor video or image; returns the avatar directory (appears only when complete)."""
    source = Path(source)
    name = validate_name(name if name is not None else source.stem)
    if landmarks != "mediapipe":
        raise InputError(f"--landmarks {landmarks}: the Ditto ONNX landmark models are not supported in this "
                         "build; use --landmarks mediapipe")
    info, image = open_source(source, max_size)
    cs = find_checkpoints(checkpoints, need_hubert=False)
    bar = progress or _no_progress
    with AvatarWriter(name, force=force) as writer:       # checks the name and the store before heavy work
        nets = Extractors(cs.files, resolve_device(device))
        expected = info.est_frames if max_frames is None else min(max_frames, info.est_frames)
        lmks, warned = _landmark_pass(_frames(info, image, max_frames), source, min_face_px,
                                      bar(expected, "landmarks"))
        n = len(lmks)
        if n == 0:
            raise InputError(f"{source}: the video has no frames; re-export it")
        params = np.stack([crop_params(lm) for lm in lmks])          # [N, 4] (cx, cy, size, angle)
        if n > 1:
            params = smooth_params(params, smooth_crop)
        M_c2o = np.asarray(params_to_matrix(params, 512), np.float64).reshape(n, 3, 3)

        plate = writer.plate_path(info.is_image)
        step = bar(n, "features")
        if info.is_image:
            write_plate_image(image, plate)
            feats = _feature_pass(_frames(info, image, None), n, M_c2o, lmks, nets, writer, batch_size, step)
        else:
            with open_plate_writer(plate, info.size, fps=25) as plate_writer:
                feats = _feature_pass(_teeing(_frames(info, None, n), plate_writer), n, M_c2o, lmks, nets,
                                      writer, batch_size, step)
        eye_open, eye_ball = feats.pop("eye_open"), feats.pop("eye_ball")
        x_s_info = feats if n == 1 else {k: centered_mean(v, smooth_info) for k, v in feats.items()}
        writer.finish({
            "source": {"path": str(source.resolve()), "sha256": _sha256(source), "fps": info.src_fps,
                       "size": list(info.size), "source_size": list(info.src_size), "frames": n},
            "fps": 25.0, "size": list(info.size),
            "fingerprints": cs.avatar_fingerprints(),
            "crop": {"dsize": 512, "scale": 2.3, "vx": 0.0, "vy": -0.125, "smooth_window": smooth_crop,
                     "params": params.astype(np.float64)},
            "x_s_info": x_s_info, "M_c2o": M_c2o, "eye_open": eye_open, "eye_ball": eye_ball,
            "sc": x_s_info["kp"][0].reshape(-1).copy(), "is_image": info.is_image,
            "random_weights": bool(nets.random_weights or cs.random_weights),
            "registered": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "warnings": warned,
        })
    return writer.final_dir


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
