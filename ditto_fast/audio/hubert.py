"""HuBERT audio features at 25 fps, windowed exactly as Ditto's streaming HuBERT, run in batches.

Ditto (core/atomic_components/wav2feat.py, chunksize (3, 5, 2)) pads the 16 kHz signal with
2000 zeros in front and 6480 behind, and for i = 0, 5, 10, ... while i < N takes the window of
6480 samples starting at int(i * 0.04 * 16000). The encoder's last hidden state of a window has
20 frames at 50 Hz; frames [-14:-4] are kept and averaged in consecutive pairs, giving 5 frames
at 25 fps. Windows are concatenated and cut to N = ceil(samples / 640) rows. Windows enter the
model as raw samples (no normalisation).

The start int(i * 0.04 * 16000) is kept as Ditto writes it, float rounding included (for some i
it is i * 640 - 1), so features match Ditto's sample for sample. The row count is the exact
integer ceil(n / 640); Ditto's math.ceil(n / 16000 * 25) gives one extra row for a few lengths
that are exact multiples of 640 (e.g. 4480, 8960), a float artefact not reproduced here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ditto_fast.audio.decode import frame_count
from ditto_fast.audio.hf_folder import FolderKind, fuse_for_inference, load_encoder, read_tensors
from ditto_fast.core.errors import CheckpointError
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE

WINDOW = 6480          # samples per window: int((3 + 5 + 2) * 0.04 * 16000) + 80
PAD_FRONT = 2000       # WINDOW - int((5 + 2) * 0.04 * 16000)
PAD_BACK = WINDOW
FRAMES_PER_WINDOW = 5  # 25 fps frames each window contributes
KEEP_START, KEEP_END = -14, -4  # 50 Hz frames kept from the window's 20
HOP = 320              # samples per 50 Hz encoder frame (product of the conv strides)


def window_starts(num_frames: int) -> np.ndarray:
    """Start offsets (in the padded signal) of Ditto's windows for num_frames output frames."""
    return np.array([int(i * 0.04 * SPEECH_SAMPLE_RATE) for i in range(0, num_frames, FRAMES_PER_WINDOW)],
                    dtype=np.int64)


def pad_signal(audio_16k: np.ndarray) -> np.ndarray:
    """Zero-pad a 16 kHz signal as Ditto does: 2000 samples in front, 6480 behind. [n] -> [n + 8480]"""
    out = np.zeros(PAD_FRONT + audio_16k.shape[0] + PAD_BACK, dtype=np.float32)
    out[PAD_FRONT:PAD_FRONT + audio_16k.shape[0]] = audio_16k
    return out


HUBERT = FolderKind("HuBERT", "hubert", "facebook/hubert-large-ls960-ft",
                    "give the hubert-large-ls960-ft directory or run `ditto-fast checkpoints init-random`")


def load_hubert_encoder(model_dir: str | os.PathLike, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Load a local transformers HuBERT directory (HubertModel or HubertForCTC) as the encoder, eval mode."""
    from transformers import HubertModel

    return load_encoder(HubertModel, model_dir, HUBERT, device, dtype)


def read_ctc_head(model_dir: str | os.PathLike) -> tuple[torch.Tensor, torch.Tensor]:
    """HubertForCTC's lm_head (weight [vocab, hidden], bias [vocab]) from a transformers HuBERT directory's weights
    (model.safetensors, or pytorch_model.bin read as plain tensors); CheckpointError when it has none."""
    model_dir = Path(model_dir)
    names = ("lm_head.weight", "lm_head.bias")
    got = read_tensors(model_dir, names, HUBERT, "HuBERT's character head")
    if got is None:
        raise CheckpointError(f"{model_dir}: this HuBERT has no character head (lm_head: HubertForCTC, as "
                              "facebook/hubert-large-ls960-ft); --script needs it, or give timed text with --captions")
    return got[names[0]], got[names[1]]


class HubertFeatures:
    """16 kHz mono float32 audio -> HuBERT features [N, hidden] at 25 fps, Ditto's windowing, batched.

    Batched path: the conv front end (feature extractor + projection) acts on each 50 Hz frame's
    own 400 samples, so for windows whose starts are 320-sample aligned it runs once over the span
    a batch of windows covers, and each window takes its 20 frames from there (overlapping windows
    share work); windows Ditto's float rounding starts off the grid get their own front end. The
    transformer encoder then runs on [B, 20, hidden] at once.
    """

    def __init__(self, model_dir: str | os.PathLike, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, batch_size: int | None = None):
        self.device = torch.device(device)
        self.dtype = dtype
        self.batch_size = int(batch_size or (64 if self.device.type == "cuda" else 16))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = fuse_for_inference(load_hubert_encoder(model_dir, self.device, dtype))
        self.hidden_size = int(self.model.config.hidden_size)
        self.model_dir = Path(model_dir)
        self.ctc_head: torch.nn.Linear | None = None      # loaded when a script is aligned (load_ctc_head)

    def _tensor(self, samples: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(samples)).to(device=self.device, dtype=self.dtype)

    def _frontend(self, samples: np.ndarray) -> torch.Tensor:
        """Conv feature extractor + projection: samples [B, T] -> [B, (T - 400) // 320 + 1, hidden]."""
        feats = self.model.feature_extractor(self._tensor(samples)).transpose(1, 2)  # [B, F, 512]
        return self.model.feature_projection(feats)  # [B, F, hidden]

    def _pool(self, hidden: torch.Tensor) -> np.ndarray:
        """Last hidden state [B, 20, hidden] -> Ditto's 25 fps frames [B, 5, hidden] float32."""
        if hidden.shape[1] != 20:
            raise CheckpointError(f"HuBERT gives {hidden.shape[1]} frames per {WINDOW}-sample window, "
                                  "expected 20; the conv kernel/stride pattern must be hubert's")
        kept = hidden[:, KEEP_START:KEEP_END].float()  # [B, 10, hidden]
        return kept.reshape(kept.shape[0], FRAMES_PER_WINDOW, 2, -1).mean(dim=2).cpu().numpy()

    def load_ctc_head(self) -> torch.nn.Linear:
        """The checkpoint's character head (HubertForCTC's lm_head: hidden -> vocab), loaded once; CheckpointError
        when the directory has none (a HubertModel without the fine-tuned head)."""
        if self.ctc_head is None:
            weight, bias = read_ctc_head(self.model_dir)
            head = torch.nn.Linear(weight.shape[1], weight.shape[0])
            with torch.no_grad():
                head.weight.copy_(weight)
                head.bias.copy_(bias)
            self.ctc_head = head.to(device=self.device, dtype=torch.float32).eval()
        return self.ctc_head

    @torch.inference_mode()
    def _encode_batch(self, padded: np.ndarray, starts: np.ndarray, ctc: bool = False):
        """Windows padded[s:s + 6480] for s in starts [B] -> [B, 5, hidden], sharing the front end; with `ctc` also
        the character head's log-probabilities of each window's kept 50 Hz frames [B, 10, vocab]."""
        frames = [None] * len(starts)
        aligned = np.flatnonzero(starts % HOP == 0)
        if aligned.size:
            a0, a1 = int(starts[aligned[0]]), int(starts[aligned[-1]])
            span = self._frontend(padded[None, a0:a1 + WINDOW])[0]  # [(a1 - a0) / 320 + 20, hidden]
            for j in aligned:
                f0 = (int(starts[j]) - a0) // HOP
                frames[j] = span[f0:f0 + 20]
        odd = np.flatnonzero(starts % HOP != 0)
        if odd.size:
            idx = starts[odd, None] + np.arange(WINDOW)  # [k, 6480]
            own = self._frontend(padded[idx])  # [k, 20, hidden]
            for n, j in enumerate(odd):
                frames[j] = own[n]
        hidden = self.model.encoder(torch.stack(frames)).last_hidden_state  # [B, 20, hidden]
        if not ctc:
            return self._pool(hidden)
        logits = self.ctc_head(hidden[:, KEEP_START:KEEP_END].float())  # [B, 10, vocab]
        return self._pool(hidden), torch.log_softmax(logits, dim=-1).cpu().numpy()

    def chunk(self, samples: np.ndarray) -> np.ndarray:
        """One 6480-sample window [6480] float32 -> its 5 frames [5, hidden], as Ditto's run_chunk computes them."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.shape != (WINDOW,):
            raise ValueError(f"a chunk is [{WINDOW}] samples, got shape {samples.shape}")
        return self._encode_batch(samples, np.zeros(1, np.int64))[0]  # [5, hidden]

    def features(self, audio_16k: np.ndarray, batch_size: int | None = None,
                 progress: Callable[[int, int], None] | None = None, ctc: bool = False):
        """Features for a whole signal [n] -> [ceil(n / 640), hidden], windows run batch_size at a time;
        `progress(rows done, rows)` is called before the first batch and after each. With `ctc`, (features, the
        character head's log-probabilities at 50 Hz [2 * rows, vocab]) from the same windows' kept frames (the
        frames pooled into the features: one head more, no other pass)."""
        audio = np.asarray(audio_16k, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"expected mono audio [n], got shape {audio.shape}")
        bs = int(batch_size or self.batch_size)
        n_frames = frame_count(audio.shape[0])
        out = np.empty((n_frames, self.hidden_size), dtype=np.float32)  # [N, hidden]
        if ctc:
            head = self.load_ctc_head()
            logp = np.empty((2 * n_frames, head.out_features), dtype=np.float32)  # [2N, vocab] at 50 Hz
        if n_frames == 0:
            return (out, logp) if ctc else out
        padded = pad_signal(audio)  # [n + 8480]
        starts = window_starts(n_frames)
        if progress is not None:
            progress(0, n_frames)
        for b0 in range(0, len(starts), bs):
            got = self._encode_batch(padded, starts[b0:b0 + bs], ctc)
            feats = got[0] if ctc else got  # [B, 5, hidden]
            row0 = b0 * FRAMES_PER_WINDOW
            rows = min(n_frames - row0, feats.shape[0] * FRAMES_PER_WINDOW)
            out[row0:row0 + rows] = feats.reshape(-1, self.hidden_size)[:rows]
            if ctc:
                logp[2 * row0:2 * (row0 + rows)] = got[1].reshape(-1, logp.shape[1])[:2 * rows]
            if progress is not None:
                progress(row0 + rows, n_frames)
        return (out, logp) if ctc else out

    def __call__(self, audio_16k: np.ndarray, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """[n] float32 16 kHz mono -> [ceil(n / 640), hidden] float32 (progress: see features)."""
        return self.features(audio_16k, progress=progress)
