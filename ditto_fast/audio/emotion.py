"""The emotion of speech as FLOAT reads it (its Audio2Emotion): a wav2vec2 speech-emotion classifier, checkpoint
r-f/wav2vec-english-speech-emotion-recognition, loaded from its Hugging Face folder unchanged.

The encoder is transformers' Wav2Vec2Model (the folder's config, its `wav2vec2.*` keys); the head is this module's:
the last hidden states mean-pooled over time, `classifier.dense`, tanh, `classifier.out_proj` -> 7 logits, softmax.
Input is 16 kHz mono normalised to zero mean and unit variance, (x - mean) / sqrt(var + 1e-7), as FLOAT's
Wav2Vec2FeatureExtractor (do_normalize) does; here each window is normalised on its own, as FLOAT normalises a clip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ditto_fast.audio.hf_folder import FolderKind, check_folder, fuse_for_inference, load_encoder, read_tensors
from ditto_fast.checkpoints import EMOTION_LABELS
from ditto_fast.checkpoints.random_hubert import RANDOM_MARK
from ditto_fast.core.errors import CheckpointError
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE

LABELS = EMOTION_LABELS     # FLOAT's id2label, in its order
MIN_SAMPLES = 400           # the conv front end's receptive field: a shorter signal is zero-padded to it
NORM_EPS = 1e-7             # Wav2Vec2FeatureExtractor's zero_mean_unit_var_norm
HEAD_KEYS = ("classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight",
             "classifier.out_proj.bias")
SPEECH_EMOTION = FolderKind("speech-emotion", "wav2vec2", "r-f/wav2vec-english-speech-emotion-recognition",
                            "download r-f/wav2vec-english-speech-emotion-recognition there, or run "
                            "`ditto-fast checkpoints init-random`")


def normalise(windows: np.ndarray) -> np.ndarray:
    """Each row of [B, T] (or one [T] signal) to zero mean and unit variance, as FLOAT's feature extractor."""
    x = np.asarray(windows, dtype=np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + NORM_EPS)).astype(np.float32)


def window_starts(n_samples: int, window: int, hop: int) -> np.ndarray:
    """Starts of windows of `window` samples every `hop` samples over a signal of n_samples, the last one ending at
    the signal's end (so every window is whole); one window at 0 when the signal is shorter than a window."""
    if n_samples <= window:
        return np.zeros(1, np.int64)
    starts = list(range(0, n_samples - window + 1, hop))
    if starts[-1] != n_samples - window:
        starts.append(n_samples - window)
    return np.asarray(starts, np.int64)


@dataclass(frozen=True)
class EmotionWindows:
    """The classifier's reading of a signal in windows: where each window lies, how loud it is, what it hears."""

    starts: np.ndarray      # [W] first sample of each window
    length: int             # samples per window
    scores: np.ndarray      # [W, 7] probabilities, LABELS' order
    rms_db: np.ndarray      # [W] each window's RMS level in dBFS (before the normalisation)

    @property
    def centres(self) -> np.ndarray:
        """[W] each window's centre in seconds."""
        return (self.starts + self.length / 2) / SPEECH_SAMPLE_RATE


class SpeechEmotion:
    """A speech-emotion classifier (FLOAT's Audio2Emotion): 16 kHz speech -> probabilities of LABELS."""

    labels = LABELS

    def __init__(self, encoder: torch.nn.Module, dense: torch.nn.Linear, out_proj: torch.nn.Linear,
                 model_dir: Path, device: torch.device, random_weights: bool = False):
        self.encoder, self.dense, self.out_proj = encoder, dense, out_proj
        self.model_dir, self.device = model_dir, device
        self.random_weights = random_weights        # written by `checkpoints init-random`: its readings are noise
        self.batch_size = 16 if device.type == "cuda" else 4

    @classmethod
    def load(cls, folder: str | os.PathLike, device: str | torch.device = "cpu") -> "SpeechEmotion":
        """The classifier in a Hugging Face folder (config.json + pytorch_model.bin or model.safetensors, keys
        `wav2vec2.*` and `classifier.*`); CheckpointError naming the folder when it is missing or not this model."""
        from transformers import Wav2Vec2Model

        folder, device = Path(folder), torch.device(device)
        cfg = check_folder(folder, SPEECH_EMOTION)
        names = [v for _, v in sorted((int(k), v) for k, v in (cfg.get("id2label") or {}).items())]
        if names and not all(n.startswith("LABEL_") for n in names) and tuple(n.lower() for n in names) != LABELS:
            raise CheckpointError(f"{folder / 'config.json'}: its labels are {', '.join(names)}, not FLOAT's "
                                  f"{', '.join(LABELS)}; give the {SPEECH_EMOTION.source} directory")
        head = read_tensors(folder, HEAD_KEYS, SPEECH_EMOTION, "the speech-emotion head")
        if head is None:
            raise CheckpointError(f"{folder}: no classifier head (classifier.dense, classifier.out_proj); give the "
                                  f"{SPEECH_EMOTION.source} directory, not a bare wav2vec2 model")
        hidden = int(cfg.get("hidden_size", 0))
        shapes_ok = (head[HEAD_KEYS[0]].shape == (hidden, hidden) and head[HEAD_KEYS[2]].shape == (len(LABELS), hidden)
                     and head[HEAD_KEYS[1]].shape == (hidden,) and head[HEAD_KEYS[3]].shape == (len(LABELS),))
        if not shapes_ok:
            raise CheckpointError(f"{folder}: the classifier head's shapes do not fit {len(LABELS)} labels over "
                                  f"{hidden} hidden units; re-download the {SPEECH_EMOTION.name} directory")
        encoder = fuse_for_inference(load_encoder(Wav2Vec2Model, folder, SPEECH_EMOTION, device))
        dense, out_proj = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, len(LABELS))
        with torch.no_grad():
            for layer, (w, b) in ((dense, HEAD_KEYS[:2]), (out_proj, HEAD_KEYS[2:])):
                layer.weight.copy_(head[w])
                layer.bias.copy_(head[b])
        return cls(encoder, dense.to(device).eval(), out_proj.to(device).eval(), folder, device,
                   bool(cfg.get(RANDOM_MARK)))

    @torch.inference_mode()
    def logits(self, windows: np.ndarray) -> np.ndarray:
        """Raw 16 kHz windows [B, T] (one length) -> logits [B, 7]; each window normalised on its own."""
        x = normalise(np.atleast_2d(np.asarray(windows, np.float32)))
        if x.shape[1] < MIN_SAMPLES:
            x = np.pad(x, ((0, 0), (0, MIN_SAMPLES - x.shape[1])))
        hidden = self.encoder(torch.from_numpy(x).to(self.device)).last_hidden_state   # [B, F, H]
        pooled = hidden.mean(dim=1)                                                     # [B, H]
        return self.out_proj(torch.tanh(self.dense(pooled))).float().cpu().numpy()     # [B, 7]

    def scores(self, samples_16k: np.ndarray) -> np.ndarray:
        """One 16 kHz mono signal [n] -> the probabilities of LABELS [7], as FLOAT gives them for a clip."""
        samples = np.asarray(samples_16k, np.float32)
        if samples.ndim != 1 or samples.size == 0:
            raise ValueError(f"expected mono audio [n], got shape {samples.shape}")
        return _softmax(self.logits(samples[None]))[0]

    def windows(self, samples_16k: np.ndarray, window_seconds: float, hop_seconds: float,
                batch_size: int | None = None, progress: Callable[[int, int], None] | None = None) -> EmotionWindows:
        """The probabilities of windows of `window_seconds` every `hop_seconds` over a signal [n] (see
        window_starts), run `batch_size` windows at a time; `progress(windows done, windows)` after each batch."""
        samples = np.asarray(samples_16k, np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono audio [n], got shape {samples.shape}")
        window = int(round(window_seconds * SPEECH_SAMPLE_RATE))
        starts = window_starts(samples.shape[0], window, max(1, int(round(hop_seconds * SPEECH_SAMPLE_RATE))))
        length = min(window, samples.shape[0])
        bs = int(batch_size or self.batch_size)
        scores = np.zeros((len(starts), len(LABELS)), np.float32)
        rms = np.full(len(starts), -200.0)
        for b0 in range(0, len(starts), bs):
            idx = starts[b0:b0 + bs, None] + np.arange(length)                  # [b, length]
            chunk = samples[idx]
            if length:
                scores[b0:b0 + len(idx)] = _softmax(self.logits(chunk))
                power = np.mean(np.square(chunk, dtype=np.float64), axis=1)
                rms[b0:b0 + len(idx)] = 10 * np.log10(np.maximum(power, 1e-20))
            if progress is not None:
                progress(min(b0 + bs, len(starts)), len(starts))
        return EmotionWindows(starts, length, scores, rms)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
