"""Slow reference paths that the package's fast paths are checked against (tests) and timed against (benchmarks)."""

from __future__ import annotations

import numpy as np
import torch

from ditto_fast.audio.decode import frame_count
from ditto_fast.audio.hubert import WINDOW, HubertFeatures, pad_signal, window_starts
from ditto_fast.models.lmdm import DEFAULT_GUIDANCE, LMDM


def lmdm_uncond(net: LMDM, x: torch.Tensor, cond_frame: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The LMDM's unconditional (condition dropped) raw output alone, x_start-like [B, N, F] float32."""
    enc = net.encode_condition(None, with_cond=False, batch=x.shape[0])
    return net.model_output(x, cond_frame, enc, t)


def lmdm_two_pass(net: LMDM, x: torch.Tensor, cond_frame: torch.Tensor, cond: torch.Tensor, t: torch.Tensor,
                  guidance: float = DEFAULT_GUIDANCE) -> tuple[torch.Tensor, torch.Tensor]:
    """What net(x, cond_frame, cond, t) gives, with the conditional and unconditional passes run one after the other."""
    cond_out = net.model_output(x, cond_frame, net.encode_condition(cond, with_null=False), t)
    uncond_out = lmdm_uncond(net, x, cond_frame, t)
    x_start = uncond_out + (cond_out - uncond_out) * guidance
    return net.predict_noise_from_start(x, t, x_start), x_start


@torch.inference_mode()
def hubert_encode_windows(features: HubertFeatures, windows: np.ndarray) -> np.ndarray:
    """Whole HuBERT model on raw windows [B, 6480] -> [B, 5, hidden] float32 (Ditto's per-window call)."""
    return features._pool(features.model(features._tensor(windows)).last_hidden_state)


def hubert_features_one_by_one(features: HubertFeatures, audio_16k: np.ndarray) -> np.ndarray:
    """Ditto's loop: one raw window per whole-model call, concatenated and cut to N rows [N, hidden]."""
    audio = np.asarray(audio_16k, dtype=np.float32)
    n_frames = frame_count(audio.shape[0])
    padded = pad_signal(audio)
    chunks = [hubert_encode_windows(features, padded[None, s:s + WINDOW])[0] for s in window_starts(n_frames)]
    if not chunks:
        return np.empty((0, features.hidden_size), dtype=np.float32)
    return np.concatenate(chunks, axis=0)[:n_frames]
