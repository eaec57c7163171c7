"""PCM as it streams, at any rate and channel count, to the model's 16 kHz mono (soxr, a maintained resampler):
what a TTS engine speaks (22.05, 24, 44.1, 48 kHz) becomes what HuBERT hears, and with BandResampler also the
stream's 48 kHz in step with it."""

from __future__ import annotations

import numpy as np

from ditto_fast.media.rates import BAND_PER_SAMPLE, SPEECH_SAMPLE_RATE, STREAM_SAMPLE_RATE


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


class BandResampler:
    """PCM at any rate to what the model hears (16 kHz) and, in step with it, to the stream's 48 kHz (its band kept):
    each call gives three band samples for each 16 kHz one. The two filters give their samples in other lumps (up to
    25 ms apart); what one gives ahead of the other waits for it, so the band never runs short of the speech."""

    def __init__(self, rate: int, channels: int = 1):
        self.speech = Resampler(rate, channels)
        self.band = Resampler(rate, channels, to=STREAM_SAMPLE_RATE)
        self.rate, self.channels = self.speech.rate, self.speech.channels
        self._x, self._b = np.zeros(0, np.float32), np.zeros(0, np.float32)

    def __call__(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """The samples `data` brings: (16 kHz [n], 48 kHz [3 n])."""
        self._x = np.concatenate([self._x, self.speech(data)])
        self._b = np.concatenate([self._b, self.band(data)])
        n = min(len(self._x), len(self._b) // BAND_PER_SAMPLE)
        out = self._x[:n], self._b[:n * BAND_PER_SAMPLE]
        self._x, self._b = self._x[n:], self._b[n * BAND_PER_SAMPLE:]
        return out

    def flush(self) -> tuple[np.ndarray, np.ndarray]:
        """Everything still held (the end of an answer), the shorter side padded with silence to stay in step; the
        next call starts fresh."""
        x = np.concatenate([self._x, self.speech.flush()])
        b = np.concatenate([self._b, self.band.flush()])
        self._x, self._b = np.zeros(0, np.float32), np.zeros(0, np.float32)
        n = max(len(x), -(-len(b) // BAND_PER_SAMPLE))
        return np.pad(x, (0, n - len(x))), np.pad(b, (0, n * BAND_PER_SAMPLE - len(b)))
