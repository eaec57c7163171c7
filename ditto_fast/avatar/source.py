"""Open a registration source by content (image or video) and stream its frames, resized, at 25 fps."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

from ..errors import InputError
from ..inputs import check_input_file
from ..memory import serve_frames_from_mmap

logging.getLogger("imageio_ffmpeg").setLevel(logging.ERROR)

FPS = 25
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"BM", b"GIF8", b"II*\x00", b"MM\x00*", b"RIFF")


@dataclass
class SourceInfo:
    path: Path
    is_image: bool
    src_size: tuple[int, int]     # (w, h) as stored
    size: tuple[int, int]         # (w, h) after resizing: long side <= max_size, even dims
    src_fps: float
    est_frames: int               # frames at 25 fps (exact for images)


def target_size(w: int, h: int, max_size: int) -> tuple[int, int]:
    """Scale (w, h) so the long side is at most max_size, then round both down to even numbers."""
    s = min(1.0, max_size / max(w, h))
    tw, th = max(2, int(round(w * s)) // 2 * 2), max(2, int(round(h * s)) // 2 * 2)
    return tw, th


def _read_image(path: Path) -> np.ndarray | None:
    head = path.open("rb").read(16)
    if not any(head.startswith(m) for m in _IMAGE_MAGIC) or (head.startswith(b"RIFF") and head[8:12] != b"WEBP"):
        return None
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise InputError(f"{path}: image is truncated or corrupt; re-export it as PNG or JPEG")
    if img.dtype != np.uint8:
        img = cv2.convertScaleAbs(img, alpha=255.0 / max(1, float(img.max())))
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
    elif img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGB)     # alpha dropped: the plate is opaque
    else:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return img


def open_source(path: str | Path, max_size: int) -> tuple[SourceInfo, np.ndarray | None]:
    """Probe `path` by content; returns its info and, for an image, the resized RGB image."""
    path = Path(path)
    check_input_file(path, "the anchor video or image file")
    img = _read_image(path)
    if img is not None:
        h, w = img.shape[:2]
        tw, th = target_size(w, h, max_size)
        if (tw, th) != (w, h):
            img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA)
        return SourceInfo(path, True, (w, h), (tw, th), 0.0, 1), np.ascontiguousarray(img)
    import imageio_ffmpeg

    try:
        gen = imageio_ffmpeg.read_frames(str(path))
        meta = next(gen)
        gen.close()
    except (OSError, RuntimeError, StopIteration) as e:
        msg = str(e).strip().splitlines()[-1][:120] if str(e).strip() else "no video stream"
        raise InputError(f"{path}: not a readable video or image ({msg}); give an MP4/MOV/MKV video "
                         "or a PNG/JPEG image") from None
    w, h = meta["size"]
    if w <= 0 or h <= 0:
        raise InputError(f"{path}: video has no picture size; re-export it")
    duration = float(meta.get("duration") or 0.0)
    tw, th = target_size(w, h, max_size)
    return SourceInfo(path, False, (w, h), (tw, th), float(meta.get("fps") or FPS),
                      max(1, int(round(duration * FPS)))), None


def iter_frames(info: SourceInfo, max_frames: int | None = None) -> Iterator[np.ndarray]:
    """Stream RGB uint8 frames [H,W,3] of a video source, resampled to 25 fps and resized; never all in RAM."""
    import imageio_ffmpeg

    serve_frames_from_mmap()
    w, h = info.size
    vf = f"fps={FPS},scale={w}:{h}:flags=area"
    gen = imageio_ffmpeg.read_frames(str(info.path), output_params=["-vf", vf])
    try:
        next(gen)
        for i, buf in enumerate(gen):
            if max_frames is not None and i >= max_frames:
                break
            if len(buf) != w * h * 3:
                break  # truncated tail
            yield np.frombuffer(buf, np.uint8).reshape(h, w, 3)
    except RuntimeError as e:
        raise InputError(f"{info.path}: video is truncated or corrupt ({str(e).strip().splitlines()[-1][:120]}); "
                         "re-export it") from None
    finally:
        gen.close()
