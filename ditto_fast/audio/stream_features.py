"""HuBERT features for a live 16 kHz stream, chunk by chunk as Ditto's online inference feeds run_chunk.

The stream is preceded by 1920 zeros (chunksize[0] * 640); chunk k is padded-stream samples
[3200 k, 3200 k + 6480) and gives 5 feature rows. At the end, chunks start at every multiple of 3200
below the padded length, zero-filled past its end. Ditto's online features are therefore 80 samples
off its offline ones (front pad 1920, not 2000): that is Ditto's behaviour, kept here.
"""

from __future__ import annotations

import numpy as np

from ditto_fast.audio.hubert import WINDOW, HubertFeatures

STREAM_PAD_FRONT = 1920                     # chunksize[0] * 640 zeros before the stream
CHUNK_HOP = 3200                            # samples between chunk starts: chunksize[1] * 640
CHUNK_LOOKAHEAD = WINDOW - STREAM_PAD_FRONT - CHUNK_HOP   # 1360: audio a chunk needs beyond its own 3200 samples


class StreamFeatures:
    """Feeds of 16 kHz samples in, Ditto's online feature items [5, hidden] out; holds under one chunk of audio."""

    def __init__(self, hubert: HubertFeatures):
        self.hubert = hubert
        self.chunks_out = 0
        self._held = np.zeros(STREAM_PAD_FRONT, np.float32)   # padded stream from sample CHUNK_HOP * chunks_out on
        self._flushed = False

    def feed(self, samples: np.ndarray) -> list[np.ndarray]:
        """More samples [n] float32 -> the items [5, hidden] of every chunk they complete."""
        if self._flushed:
            raise RuntimeError("the stream was flushed; make a new StreamFeatures")
        samples = np.asarray(samples, np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono samples [n], got shape {samples.shape}")
        self._held = np.concatenate([self._held, samples])
        out = []
        while len(self._held) >= WINDOW:
            out.append(self._next(self._held[:WINDOW]))
        return out

    def flush(self) -> list[np.ndarray]:
        """End of the stream -> the items of the chunks left, the last ones zero-filled to 6480 samples."""
        if self._flushed:
            return []
        self._flushed = True
        out = []
        while len(self._held):
            window = np.zeros(WINDOW, np.float32)
            part = self._held[:WINDOW]
            window[:len(part)] = part
            out.append(self._next(window))
        return out

    def _next(self, window: np.ndarray) -> np.ndarray:
        """Encode the chunk at the front of the held samples and drop its first CHUNK_HOP samples."""
        feats = self.hubert.chunk(window)  # [5, hidden]
        self._held = self._held[CHUNK_HOP:]
        self.chunks_out += 1
        return feats
