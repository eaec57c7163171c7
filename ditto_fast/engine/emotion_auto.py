"""`--emotion auto` in a render: the speech-emotion classifier run over the clip's decoded 16 kHz audio (the samples
HuBERT reads, not decoded again) in overlapping windows, batched; the windows smoothed into a per-frame track
(motion/emotion_track.py) and put into the clip's emotion where it says auto; what the timings JSON says of it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

from ditto_fast.engine.clip import Clip
from ditto_fast.motion.conditions import emotion_vector, neutral_blend
from ditto_fast.motion.emotion_track import AutoEmotion, EmotionTrack, emotion_track
from ditto_fast.motion.emotions import EMOTIONS

if TYPE_CHECKING:       # the classifier (torch, transformers) loads where the engine runs, not where jobs are checked
    from ditto_fast.audio.emotion import EmotionWindows, SpeechEmotion
    from ditto_fast.checkpoints import CheckpointSet

AUTO_SETTINGS = AutoEmotion()       # windows, smoothing and hysteresis of every auto track (see emotion_track.py)


def class_vectors() -> np.ndarray:
    """[8, 8] the condition vector of each class, as `--emotion <class>` gives it."""
    return np.stack([emotion_vector(e) for e in EMOTIONS])


def read_emotion(model: SpeechEmotion, clip: Clip, progress: Callable[[int, int], None] | None = None,
                 settings: AutoEmotion = AUTO_SETTINGS) -> tuple[EmotionTrack, EmotionWindows]:
    """The clip's speech-emotion track at its output rate, and the classifier's windows it came from."""
    windows = model.windows(clip.audio.samples, settings.window, settings.hop, progress=progress)
    track = emotion_track(windows.centres, windows.scores, model.labels, windows.rms_db, clip.frames,
                          float(clip.rate), class_vectors(), settings)
    return track, windows


def with_auto_emotion(clip: Clip, track: EmotionTrack) -> Clip:
    """The clip with its per-frame emotion complete: its fixed part plus each frame's share of the track, then
    blended toward neutral by its strength."""
    per_frame = clip.emotion + clip.emotion_auto[:, None] * track.vectors      # [N, 8]
    return dataclasses.replace(clip, emotion=neutral_blend(per_frame, clip.emotion_strength))


def emotion_record(track: EmotionTrack, windows: EmotionWindows, seconds: float, model: SpeechEmotion,
                   settings: AutoEmotion = AUTO_SETTINGS) -> dict:
    """The timings JSON's "emotion": how the track was read, what it cost, and each second's label and
    probabilities (Ditto's eight classes; contempt, which the classifier does not know, stays 0)."""
    silent = int(np.count_nonzero(windows.rms_db < settings.silence_db))
    return {"source": "auto", "model": str(model.model_dir), "random_weights": model.random_weights,
            "settings": settings.as_dict(), "windows": len(windows.starts),
            "silent_windows": silent, "seconds": round(seconds, 4), "switches": track.switches(),
            "per_second": track.per_second()}


def check_emotion_model(clip: Clip, checkpoints: CheckpointSet) -> None:
    """CheckpointError (exit 6) naming the speech-emotion folder when the clip reads the speech (`auto`) and the
    checkpoints have none: refused with the clip's other checks, before any work."""
    if clip.emotion_auto is not None:
        checkpoints.require_emotion()
