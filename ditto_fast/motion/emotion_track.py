"""`--emotion auto`: the speech-emotion classifier's windows turned into a per-frame emotion condition that does not
flicker.

1. Each window's seven probabilities go onto Ditto's eight classes by name (contempt 0). A window quieter than
   `silence_db` hears no speech: it keeps the last spoken window's reading (neutral before the first).
2. Low-pass: the probabilities are interpolated from the window centres to each frame's time, then averaged over
   `smooth` seconds (a centred moving average).
3. Hysteresis: the face holds one class. Another class takes over only when it leads the held one by `margin` on
   every frame for `dwell` seconds; the switch is then dated back to the first frame of that lead (a render
   sees the whole clip, so nothing lags).
4. The condition is the held class's vector (what `--emotion <class>` gives), crossfaded linearly over `fade`
   seconds at each switch: a switch takes round(fade * rate) frames, and a class is never left and rejoined
   within `dwell`.
The smoothed probabilities are kept for the timings JSON and the preview; the held class is what the face shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ditto_fast.motion.emotions import EMOTIONS

NEUTRAL = EMOTIONS.index("neutral")


@dataclass(frozen=True)
class AutoEmotion:
    """How the auto track is read and smoothed (seconds unless said)."""

    window: float = 4.0         # audio each classifier window hears
    hop: float = 2.0            # between window starts (each second of speech is heard twice)
    smooth: float = 1.5         # the low-pass: a centred moving average this long
    margin: float = 0.15        # a rival's lead over the held class (probability) ...
    dwell: float = 1.0          # ... held this long, to take over
    fade: float = 0.6           # the crossfade from one class's vector to the next
    silence_db: float = -50.0   # windows quieter than this (RMS, dBFS) are silence

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class EmotionTrack:
    """One clip's auto emotion at its output rate."""

    probabilities: np.ndarray   # [N, 8] smoothed probabilities, EMOTIONS' order
    held: np.ndarray            # [N] int: the class the face shows (the crossfade's target)
    vectors: np.ndarray         # [N, 8] the emotion condition per frame
    rate: float                 # frames per second

    def per_second(self) -> list[dict]:
        """Each second of the clip: the class the face shows most in it and the mean probabilities."""
        n, per = len(self.held), max(1.0, self.rate)
        out = []
        for s in range(int(np.ceil(n / per))):
            rows = slice(int(round(s * per)), min(n, int(round((s + 1) * per))))
            if rows.start >= rows.stop:
                break
            label = int(np.bincount(self.held[rows], minlength=len(EMOTIONS)).argmax())
            mean = self.probabilities[rows].mean(axis=0)
            out.append({"second": s, "label": EMOTIONS[label],
                        "probabilities": {e: round(float(p), 3) for e, p in zip(EMOTIONS, mean)}})
        return out

    def switches(self) -> int:
        """How many times the held class changes."""
        return int(np.count_nonzero(np.diff(self.held)))


def to_ditto_classes(scores: np.ndarray, labels: tuple[str, ...]) -> np.ndarray:
    """[W, len(labels)] probabilities named by `labels` -> [W, 8] in EMOTIONS' order (classes not named: 0)."""
    out = np.zeros((scores.shape[0], len(EMOTIONS)), np.float64)
    for i, name in enumerate(labels):
        out[:, EMOTIONS.index(name)] = scores[:, i]
    return out


def hold_through_silence(probs: np.ndarray, voiced: np.ndarray) -> np.ndarray:
    """[W, 8] with each silent window's row replaced by the last voiced one's (neutral before the first)."""
    out = np.array(probs, np.float64)
    last = np.zeros(out.shape[1])
    last[NEUTRAL] = 1.0
    for i in range(len(out)):
        if voiced[i]:
            last = out[i]
        else:
            out[i] = last
    return out


def low_pass(track: np.ndarray, frames: int) -> np.ndarray:
    """[N, C] averaged over a centred window of `frames` (odd; the ends repeat the edge values)."""
    k = max(1, int(frames) | 1)
    if k == 1 or len(track) == 0:
        return np.array(track, np.float64)
    padded = np.pad(track, ((k // 2, k // 2), (0, 0)), mode="edge")
    csum = np.cumsum(np.vstack([np.zeros((1, track.shape[1])), padded]), axis=0)
    return (csum[k:] - csum[:-k]) / k


def hysteresis(probs: np.ndarray, margin: float, dwell_frames: int) -> np.ndarray:
    """[N] held class: starts at frame 0's leader; a rival takes over when it leads the held class by `margin` on
    `dwell_frames` frames in a row, from the first of them."""
    n = len(probs)
    held = np.zeros(n, np.int64)
    if n == 0:
        return held
    cur, i = int(probs[0].argmax()), 0
    while i < n:
        leader = int(probs[i].argmax())
        if leader != cur and probs[i, leader] - probs[i, cur] >= margin:
            j = i
            while j < n and int(probs[j].argmax()) == leader and probs[j, leader] - probs[j, cur] >= margin:
                j += 1
            if j - i >= dwell_frames:
                held[i:j] = leader          # dated back to the lead's first frame
                cur, i = leader, j
                continue
            held[i:j] = cur
            i = j
            continue
        held[i] = cur
        i += 1
    return held


def crossfade(held: np.ndarray, class_vectors: np.ndarray, fade_frames: int) -> np.ndarray:
    """[N, 8] the held classes' vectors, each switch a linear crossfade over `fade_frames` frames from where the face
    is (the switch's frame is the first one that moves, the last one of the fade is the new class's vector)."""
    n, fade = len(held), max(1, int(fade_frames))
    out = np.zeros((n, class_vectors.shape[1]), np.float64)
    if n == 0:
        return out
    out[0] = class_vectors[held[0]]
    start, origin = -1, out[0]
    for i in range(1, n):
        if held[i] != held[i - 1]:
            start, origin = i, out[i - 1].copy()
        target = class_vectors[held[i]]
        step = i - start + 1
        out[i] = origin + (step / fade) * (target - origin) if start >= 0 and step < fade else target
    return out


def emotion_track(centres: np.ndarray, scores: np.ndarray, labels: tuple[str, ...], rms_db: np.ndarray,
                  n_frames: int, rate: float, class_vectors: np.ndarray,
                  settings: AutoEmotion = AutoEmotion()) -> EmotionTrack:
    """The per-frame auto emotion of a clip of n_frames at `rate` from its windows (centres [W] s, scores [W, 7]
    named by `labels`, rms_db [W]); `class_vectors` [8, 8]: the condition vector of each class."""
    probs = hold_through_silence(to_ditto_classes(scores, labels), np.asarray(rms_db) >= settings.silence_db)
    times = np.arange(n_frames) / rate
    framed = np.stack([np.interp(times, centres, probs[:, c]) for c in range(probs.shape[1])], axis=1) \
        if len(centres) else np.tile(np.eye(len(EMOTIONS))[NEUTRAL], (n_frames, 1))
    smooth = low_pass(framed, round(settings.smooth * rate))
    held = hysteresis(smooth, settings.margin, max(1, round(settings.dwell * rate)))
    vectors = crossfade(held, class_vectors, round(settings.fade * rate))
    return EmotionTrack(smooth.astype(np.float32), held, vectors.astype(np.float32), float(rate))
