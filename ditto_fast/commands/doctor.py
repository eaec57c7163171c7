"""`ditto-fast doctor`: the environment checked, one line each (ffmpeg, torch device, mediapipe models, checkpoints,
store); nothing changed."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ditto_fast.console.options import ENGINE
from ditto_fast.core.errors import EXIT_INTERNAL, DittoError


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    exit_code: int = 1      # what `doctor` exits with when this check fails (6: checkpoints, 3: store)


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
    import importlib.util

    if importlib.util.find_spec("mediapipe") is None:   # a render-only install: fine for render, batch, avatars
        from ditto_fast.face.landmarks import REGISTER_INSTALL

        return Check("mediapipe", True, f"not installed: a render-only install (`register` needs {REGISTER_INSTALL})")
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
    """Find the checkpoints and load each network, HuBERT and (when there) the speech-emotion classifier on the CPU,
    as a render would; the classifier is optional (`--emotion auto` needs it)."""
    from ditto_fast import models
    from ditto_fast.audio.emotion import SpeechEmotion
    from ditto_fast.audio.hubert import load_hubert_encoder
    from ditto_fast.checkpoints import find_checkpoints, resolve_root

    root = resolve_root(directory)
    try:
        cs = find_checkpoints(directory)
        for name, path in cs.files.items():
            models.load(name, path, "cpu", fuse=False)
        load_hubert_encoder(cs.hubert_dir)
        if cs.has_emotion():
            SpeechEmotion.load(cs.emotion_dir)
    except DittoError as e:
        return Check("checkpoints", False, str(e), exit_code=e.exit_code)
    except Exception as e:  # noqa: BLE001 - doctor reports anything; a file it cannot load is a checkpoint problem
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        return Check("checkpoints", False, f"{root}: not loaded ({type(e).__name__}: {first}); re-download the "
                     "checkpoints", exit_code=6)
    kind = "RANDOM weights" if cs.random_weights else "weights"
    if cs.has_emotion():
        return Check("checkpoints", True, f"{cs.root}: six networks + HuBERT + speech-emotion loaded ({kind})")
    return Check("checkpoints", True, f"{cs.root}: six networks + HuBERT loaded ({kind}); no speech-emotion "
                 f"classifier at {cs.emotion_dir} (optional: --emotion auto needs it)")


def _writable_dir(path: Path) -> tuple[bool, Path]:
    """Whether `path` (or, if it does not exist yet, its nearest existing parent) is a writable directory."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK), probe


def _store() -> Check:
    """The avatar store, looked at without changing anything (no directory made, no file written)."""
    from ditto_fast.avatar import list_avatars, store_root

    root = store_root() / "avatars"
    ok, where = _writable_dir(root)
    if not ok:
        return Check("store", False, f"{root}: not writable ({where} is not a writable directory); set "
                     "DITTO_FAST_HOME to a writable dir", exit_code=3)
    rows = list_avatars()
    damaged = sum(1 for r in rows if r.get("error"))
    free = os.statvfs(where)
    gib = free.f_bavail * free.f_frsize / 2**30
    note = f" ({damaged} damaged: see `ditto-fast avatars`)" if damaged else ""
    made = "" if root.is_dir() else " (created by the first register)"
    return Check("store", True, f"{root}{made}: {len(rows)} avatar(s){note}, {gib:.1f} GiB free")


def run_checks(checkpoints_dir=None) -> list[Check]:
    """All checks, in order; each never raises, and none changes anything on disk."""
    return [_ffmpeg(), _torch(), _mediapipe(), _checkpoints(checkpoints_dir), _store()]


@click.command()
@ENGINE["checkpoints"]
def doctor(checkpoints):
    """Check ffmpeg, torch device, mediapipe models, checkpoints (each loaded) and the avatar store, one line each;
    changes nothing. Exit 6 if the checkpoints fail, 3 if the store is not writable."""
    failed = []
    for check in run_checks(checkpoints):
        failed += [] if check.ok else [check.exit_code]
        click.echo(f"[{'ok' if check.ok else 'FAIL'}] {check.name:<12} {check.detail}")
    # 6 for the checkpoints, 3 for the store (a broken install, ffmpeg or torch say, leaves 1)
    sys.exit(next((c for c in failed if c != EXIT_INTERNAL), failed[0]) if failed else 0)
