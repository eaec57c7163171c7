"""`ditto-fast register`: source -> landmarks -> steady crops -> extractor features -> avatar cache."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import torch

from .. import models
from ..checkpoints import find_checkpoints
from ..devices import resolve_device
from ..errors import InputError, NoFaceError
from ..face.crop import crop_params, landmarks_in_crop, params_to_matrix, smooth_params, warp_crop
from ..face.eyes import eye_features
from ..face.landmarks import FaceTracker
from ..motion.sampling import centered_mean
from ..render.plate import open_plate_writer, write_plate_image
from .cache import AvatarWriter, validate_name
from .source import iter_frames, open_source

FORMAT_VERSION = 1
INFO_KEYS = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")
Progress = Callable[[int], None]


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
        f_s = self.appearance(x).to(torch.float16).cpu().numpy()       # [B,C,D,64,64]
        out = self.motion(x)
        info = {k: out[k].float().cpu().numpy() for k in INFO_KEYS}
        return f_s, info


def _crop256(frame: np.ndarray, M_c2o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    crop512 = warp_crop(frame, M_c2o, 512)
    return crop512, cv2.resize(crop512, (256, 256), interpolation=cv2.INTER_AREA)


def register_avatar(source: str | Path, name: str | None = None, max_size: int = 1920,
                    max_frames: int | None = None, force: bool = False, checkpoints: str | Path | None = None,
                    device: str = "auto", batch_size: int = 8, landmarks: str = "mediapipe",
                    progress: Callable[[int, str], Progress] | None = None,
                    smooth_crop: int = 13, smooth_info: int = 13, min_face_px: int = 64) -> Path:
    """Register an anchor video or image; returns the avatar directory. Progress: progress(total, label) -> step."""
    source = Path(source)
    name = validate_name(name if name is not None else source.stem)
    if landmarks != "mediapipe":
        raise InputError(f"--landmarks {landmarks}: the Ditto ONNX landmark models are not supported in this "
                         "build; use --landmarks mediapipe")
    info, image = open_source(source, max_size)
    cs = find_checkpoints(checkpoints, need_hubert=False)
    dev = resolve_device(device)
    nets = Extractors(cs.files, dev)
    bar = progress or (lambda total, label: (lambda n=1: None))

    def frames():
        return iter([image]) if info.is_image else iter_frames(info, max_frames)

    # pass 1: landmarks on every frame (streamed), crop parameters per frame
    lmks: list[np.ndarray] = []
    step = bar(info.est_frames if max_frames is None else min(max_frames, info.est_frames), "landmarks")
    with FaceTracker(min_face_px=min_face_px, source=str(source)) as tracker, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, frame in enumerate(frames()):
            lmks.append(tracker(frame, i).astype(np.float32))
            step(1)
    n = len(lmks)
    if n == 0:
        raise InputError(f"{source}: video has no frames; re-export it")
    params = np.stack([crop_params(l) for l in lmks])  # [N, 4] (cx, cy, size, angle)
    if not info.is_image and n > 1:
        params = smooth_params(params, smooth_crop)
    M_c2o = np.asarray(params_to_matrix(params, 512), np.float64).reshape(n, 3, 3)

    # pass 2: crops -> eye features, f_s (memory-mapped, written in batches), x_s_info
    with AvatarWriter(name, force=force) as writer:
        plate = writer.plate_path(info.is_image)
        eye_open = np.zeros((n, 2), np.float32)
        eye_ball = np.zeros((n, 6), np.float32)
        infos = {k: [] for k in INFO_KEYS}
        f_s_map = None
        plate_ctx = nullcontext() if info.is_image else open_plate_writer(plate, info.size, fps=25)
        step = bar(n, "features")
        with plate_ctx as plate_writer:
            if info.is_image:
                write_plate_image(image, plate)
            batch, start = [], 0
            for i, frame in enumerate(frames()):
                if i >= n:
                    break
                if plate_writer is not None:
                    plate_writer.write(frame)
                crop512, crop256 = _crop256(frame, M_c2o[i])
                lmk_c = landmarks_in_crop(lmks[i], M_c2o[i], 512)[None]
                eo, eb = eye_features(lmk_c)
                eye_open[i], eye_ball[i] = eo[0], eb[0]
                batch.append(crop256)
                if len(batch) == batch_size or i == n - 1:
                    f_s, xinfo = nets(np.stack(batch))
                    if f_s_map is None:
                        f_s_map = writer.open_f_s(n, f_s.shape[1:])
                    writer.write_f_s(start, f_s)
                    for k in INFO_KEYS:
                        infos[k].append(xinfo[k])
                    start += len(batch)
                    step(len(batch))
                    batch = []
            if start != n:
                raise InputError(f"{source}: the video changed while registering ({start} of {n} frames read); retry")
        x_s_info = {k: np.concatenate(v, 0).astype(np.float32) for k, v in infos.items()}
        if not info.is_image and n > 1:
            x_s_info = {k: centered_mean(v, smooth_info) for k, v in x_s_info.items()}
        meta = {
            "format_version": FORMAT_VERSION,
            "source": {"path": str(source.resolve()), "sha256": _sha256(source), "fps": info.src_fps,
                       "size": list(info.size), "source_size": list(info.src_size), "frames": n},
            "fingerprints": cs.avatar_fingerprints(),
            "crop": {"dsize": 512, "scale": 2.3, "vx": 0.0, "vy": -0.125, "smooth_window": smooth_crop,
                     "params": params.astype(np.float64)},
            "x_s_info": x_s_info, "M_c2o": M_c2o, "eye_open": eye_open, "eye_ball": eye_ball,
            "sc": x_s_info["kp"][0].reshape(-1).copy(), "is_image": info.is_image,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "random_weights": nets.random_weights or cs.random_weights,
            "warnings": [str(w.message) for w in caught],
        }
        writer.finish(meta)
    return writer.final_dir


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
