"""Per-frame LMDM conditions: audio features (+) emotion (+) eye_open (+) eye_ball (+) shape code."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np

from ditto_fast.media.timeline import mirror_indices
from ditto_fast.core.errors import CheckpointError, InputError, UsageError
from ditto_fast.core.files import MIB, read_input, shown
from ditto_fast.motion.emotions import EMOTIONS

PART_DIMS = {"emotion": 8, "eye_open": 2, "eye_ball": 6, "sc": 63}
PART_ORDER = ("emotion", "eye_open", "eye_ball", "sc")
SCHEDULE_MAX_BYTES = 16 * MIB       # a schedule with a label per frame of a long programme stays far under this
SCHEDULE_FILE = "an emotion schedule (a JSON file)"
AUTO = "auto"                       # the emotion read from the speech (motion/emotion_track.py), alone or in a mix


def condition_parts(cond_dim: int, audio_dim: int) -> tuple[str, ...]:
    """Which optional parts a checkpoint's condition width calls for (all, when ambiguous, the larger set)."""
    extra = cond_dim - audio_dim
    best: tuple[str, ...] | None = None
    for r in range(len(PART_ORDER), -1, -1):
        for combo in itertools.combinations(PART_ORDER, r):
            if sum(PART_DIMS[p] for p in combo) == extra and best is None:
                best = combo
    if best is None:
        raise CheckpointError(f"the LMDM checkpoint expects a condition width of {cond_dim}, which no combination "
                              f"of HuBERT ({audio_dim}) + emotion/eye/shape parts gives; use the HuBERT model "
                              "the LMDM was trained with")
    return best


def emotion_vector(label: str) -> np.ndarray:
    """softmax over 8 logits: 8 at the chosen classes ('happy' or 'happy+surprise'), 0 elsewhere -> [8]."""
    names = _label_names(label)
    if names is None:
        raise UsageError(f"unknown emotion {label!r}; use one of {', '.join(EMOTIONS)}, {AUTO} (read from the "
                         "speech) or a mix like happy+surprise")
    if AUTO in names:
        raise UsageError(f"emotion {label!r} reads the speech: `{AUTO}` goes with renders (render, batch, serve "
                         "jobs), not here; name a label or a mix like happy+surprise")
    logits = np.zeros(8, np.float64)
    logits[[EMOTIONS.index(n) for n in names]] = 8.0
    e = np.exp(logits - logits.max())
    return (e / e.sum()).astype(np.float32)


def _label_names(label: str) -> list[str] | None:
    """The classes of an emotion label or mix ('happy', 'happy+surprise', 'auto+happy'); None when it is none."""
    names = [p.strip().lower() for p in label.split("+") if p.strip()]
    return names if names and all(n in EMOTIONS or n == AUTO for n in names) and names.count(AUTO) <= 1 else None


def _label_row(label: str) -> tuple[np.ndarray, float]:
    """(the fixed part [8], the auto track's share) of one label: a mix weighs its parts alike, so auto+happy is
    half the speech's emotion and half happy; a label without auto is all fixed."""
    names = _label_names(label)
    if names is None or AUTO not in names:
        return emotion_vector(label), 0.0
    rest = [n for n in names if n != AUTO]
    share = 1.0 / (len(rest) + 1)
    fixed = emotion_vector("+".join(rest)) * (1 - share) if rest else np.zeros(8, np.float32)
    return fixed.astype(np.float32), share


def neutral_blend(vectors: np.ndarray, strength: float) -> np.ndarray:
    """[.., 8] emotion vectors moved toward neutral's: strength 1 leaves them, 0 gives neutral."""
    if strength >= 1.0:
        return np.asarray(vectors, np.float32)
    neutral = emotion_vector("neutral")
    return (strength * np.asarray(vectors, np.float64) + (1 - strength) * neutral).astype(np.float32)


def _parse_range(spec: str, n: int, path: Path) -> range:
    try:
        a, _, b = spec.partition("-")
        start = int(a)
        stop = (int(b) + 1) if b else (n if _ else start + 1)
    except ValueError:
        raise InputError(f"{path}: bad frame range {spec!r}; use 'A-B', 'A-' or 'A'") from None
    if start < 0 or start >= n or stop > n or stop <= start:
        raise InputError(f"{path}: frame range {spec!r} is outside the {n} frames of this audio")
    return range(start, stop)


def schedule_file(emotion: str) -> Path | None:
    """The schedule file an --emotion value names (it ends in .json, names a file, or names a folder and is no
    emotion label: refused by name when read), else None."""
    if emotion.lstrip().startswith("{"):
        return None
    p = Path(emotion)
    if emotion.endswith(".json") or _kind(p) == "file" or _kind(p) == "folder" and _label_names(emotion) is None:
        return p
    return None


def _kind(p: Path) -> str | None:
    """"folder", "file" (anything else that exists: a FIFO too, refused by name when read) or None; None, not an
    error, for a name too long for a file or one holding a NUL byte."""
    try:
        return None if not p.exists() else "folder" if p.is_dir() else "file"
    except (OSError, ValueError):
        return None


def read_schedule_file(p: Path) -> bytes:
    """The bytes of an emotion schedule file; InputError naming it when it is missing or unreadable."""
    return read_input(p, SCHEDULE_MAX_BYTES, SCHEDULE_FILE)


def emotion_schedule(emotion: str, n: int, file_bytes: bytes | None = None) -> np.ndarray:
    """[n,8] per-frame emotion: one label for all frames, or a schedule, given inline or as a JSON file:
    {"default": "neutral", "frames": {"0-49": "happy", "120-": "sad"}}. `file_bytes`: the schedule file's
    contents when the caller has read them already. UsageError where it says `auto` (see emotion_plan)."""
    fixed, share = emotion_plan(emotion, n, file_bytes)
    if share is not None:
        raise UsageError(f"--emotion {shown(emotion)}: `{AUTO}` reads the speech, which only a render does; name "
                         "labels")
    return fixed


def emotion_plan(emotion: str, n: int, file_bytes: bytes | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(fixed [n,8], auto share [n] or None) of an --emotion value: a label, a mix, `auto`, a mix with auto
    (auto+happy), or a schedule (inline or a file) whose labels may be any of them. A frame's emotion is
    fixed + share * the speech's (motion/emotion_track.py); share is None when no frame says auto."""
    if emotion.lstrip().startswith("{"):
        try:
            data = json.loads(emotion)
        except (json.JSONDecodeError, RecursionError) as e:
            why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deep"
            raise UsageError(f"--emotion {shown(emotion)}: not valid JSON ({why}); write a schedule like "
                             '\'{"default": "neutral", "frames": {"0-49": "happy"}}\'') from None
        return _schedule(data, n, "--emotion", UsageError)
    p = schedule_file(emotion)
    if p is None:
        row, share = _label_row(emotion)
        return np.repeat(row[None], n, axis=0), (np.full(n, share, np.float32) if share else None)
    try:
        data = json.loads(read_schedule_file(p) if file_bytes is None else file_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        why = "nested too deep" if isinstance(e, RecursionError) else e
        raise InputError(f"{p}: not valid JSON ({why}); fix the emotion schedule") from None
    return _schedule(data, n, str(p), InputError)


def _schedule(data: object, n: int, where: str, error: type) -> tuple[np.ndarray, np.ndarray | None]:
    """(fixed [n,8], auto share [n] or None) from a decoded schedule; `error` (UsageError inline, InputError for a
    file) names `where`."""
    unknown = set(data) - {"default", "frames"} if isinstance(data, dict) else {"<not an object>"}
    if unknown:
        raise error(f"{where}: unknown key(s) {sorted(unknown)}; an emotion schedule has 'default' and 'frames'")
    frames = data.get("frames") or {}
    labels = [data.get("default", "neutral"), *(frames.values() if isinstance(frames, dict) else [None])]
    if not all(isinstance(v, str) for v in labels):
        raise error(f"{where}: 'default' must be an emotion and 'frames' an object of \"A-B\": emotion; "
                    "fix the emotion schedule")
    try:
        row, share = _label_row(labels[0])
        out, auto = np.repeat(row[None], n, axis=0), np.full(n, share, np.float32)
        for spec, label in frames.items():
            rows = _parse_range(str(spec), n, Path(where))
            out[rows], auto[rows] = _label_row(label)
    except (UsageError, InputError) as e:
        raise error(f"{where}: {e}" if not str(e).startswith(where) else str(e)) from None
    return out, (auto if auto.any() else None)


def build_conditions(audio_feat: np.ndarray, parts: tuple[str, ...], emotion: np.ndarray,
                     eye_open: np.ndarray, eye_ball: np.ndarray, sc: np.ndarray,
                     src_idx: np.ndarray | None = None) -> np.ndarray:
    """[N, C] float32 conditions; eye features [n_src, .] taken at `src_idx` [N] (default: mirror-looped
    over the N motion frames)."""
    n = audio_feat.shape[0]
    idx = mirror_indices(n, eye_open.shape[0]) if src_idx is None else src_idx
    pieces = {"emotion": emotion, "eye_open": eye_open[idx], "eye_ball": eye_ball[idx],
              "sc": np.broadcast_to(sc.reshape(1, -1), (n, sc.size))}
    cols = [audio_feat.astype(np.float32, copy=False)] + [pieces[p].astype(np.float32) for p in parts]
    return np.concatenate(cols, axis=1)  # [N, C]
