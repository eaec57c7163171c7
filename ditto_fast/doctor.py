"""Environment checks for `ditto-fast doctor`: ffmpeg, torch device, mediapipe models, checkpoints, store."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import DittoError


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _ffmpeg() -> Check:
    try:
        import imageio_ffmpeg

        exe = imageio_ffmpeg.get_ffmpeg_exe()
        out = subprocess.run([exe, "-hide_banner", "-encoders"], capture_output=True, text=True, timeout=20).stdout
        if "libx264" not in out:
            return Check("ffmpeg", False, f"{exe} has no libx264 encoder; reinstall imageio-ffmpeg")
        return Check("ffmpeg", True, f"{exe} (libx264, aac)")
    except Exception as e:  # noqa: BLE001 - doctor reports anything
        return Check("ffmpeg", False, f"not usable: {e}; pip install imageio-ffmpeg")


def _torch() -> Check:
    try:
        import torch

        if torch.cuda.is_available():
            return Check("torch", True, f"{torch.__version__}, CUDA device {torch.cuda.get_device_name(0)} (fp16)")
        return Check("torch", True, f"{torch.__version__}, CPU only ({torch.get_num_threads()} threads; renders slowly)")
    except Exception as e:  # noqa: BLE001
        return Check("torch", False, f"cannot import torch: {e}")


def _mediapipe() -> Check:
    try:
        import mediapipe as mp

        root = Path(mp.__file__).parent / "modules"
        needed = ["face_landmark/face_landmark_with_attention.tflite", "face_detection/face_detection_full_range_sparse.tflite"]
        missing = [n for n in needed if not (root / n).is_file()]
        if missing:
            return Check("mediapipe", False, f"{mp.__version__}: models missing ({', '.join(missing)}); "
                         "install mediapipe==0.10.21, which ships them")
        return Check("mediapipe", True, f"{mp.__version__}, face mesh + full-range detector models present")
    except Exception as e:  # noqa: BLE001
        return Check("mediapipe", False, f"cannot import mediapipe: {e}")


def _checkpoints(directory) -> Check:
    from .checkpoints import find_checkpoints

    try:
        cs = find_checkpoints(directory)
    except DittoError as e:
        return Check("checkpoints", False, str(e))
    kind = "RANDOM weights" if cs.random_weights else "weights"
    return Check("checkpoints", True, f"{cs.root}: six networks + HuBERT ({kind})")


def _store() -> Check:
    from .avatar import list_avatars, store_root

    root = store_root() / "avatars"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
    except OSError as e:
        return Check("store", False, f"{root}: not writable ({e.strerror}); set DITTO_FAST_HOME to a writable dir")
    n = len(list_avatars())
    free = os.statvfs(root)
    gib = free.f_bavail * free.f_frsize / 2**30
    return Check("store", True, f"{root}: {n} avatar(s), {gib:.1f} GiB free")


def run_checks(checkpoints_dir=None) -> list[Check]:
    """All checks, in order; each never raises."""
    return [_ffmpeg(), _torch(), _mediapipe(), _checkpoints(checkpoints_dir), _store()]
