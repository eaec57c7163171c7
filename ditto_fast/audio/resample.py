"""PCM as it streams, at any rate and channel count, to the model's 16 kHz mono (soxr, a maintained resampler):
what a TTS engine speaks (22.05, 24, 44.1, 48 kHz) becomes what HuBERT hears."""

from __future__ import annotations

import numpy as np

from ditto_fast.media.rates import SPEECH_SAMPLE_RATE


class Resampler:
    """s16le PCM at `rate` with `channels` interleaved channels to mono float32 at `to` (16 kHz), chunk by chunk;
    the channels are averaged; nothing to resample at `to` itself. `flush()` gives the filter's last samples."""

    def __init__(self, rate: int, channels: int = 1, to: int = SPEECH_SAMPLE_RATE):
        if channels < 1:
            raise ValueError(f"channels must be at least 1, got {channels}")
        self.rate, self.channels, self.to = int(rate), int(channels), int(to)
        self._stream = None
        self._half = b""

    def __call__(self, data: bytes) -> np.ndarray:
        """The samples `data` brings (an odd byte or a partial frame waits for the next call)."""
        data, self._half = self._half + data, b""
        whole = len(data) - len(data) % (2 * self.channels)
        data, self._half = data[:whole], data[whole:]
        x = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
        if self.channels > 1:
            x = x.reshape(-1, self.channels).mean(axis=1)
        if self.rate == self.to:
            return x
        if self._stream is None:
            import soxr

            self._stream = soxr.ResampleStream(self.rate, self.to, 1, dtype="float32")
        return self._stream.resample_chunk(x)

    def flush(self) -> np.ndarray:
        """The samples still in the filter (the end of an utterance); the next call starts a fresh stream."""
        stream, self._stream, self._half = self._stream, None, b""
        if stream is None:
            return np.zeros(0, np.float32)
        return stream.resample_chunk(np.zeros(0, np.float32), last=True)
