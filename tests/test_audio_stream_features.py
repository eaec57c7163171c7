"""Online HuBERT features: chunk by chunk as Ditto's inference feeds run_chunk, any feed sizes, bounded memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import HubertModel

from ditto_fast.audio.hubert import HubertFeatures, window_starts
from ditto_fast.audio.stream_features import CHUNK_HOP, CHUNK_LOOKAHEAD, STREAM_PAD_FRONT, StreamFeatures


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def hubert(tiny_hubert_dir):
    return HubertFeatures(tiny_hubert_dir)


def speech_like(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    x = 0.3 * np.sin(2 * np.pi * 170 * t) * (1 + np.sin(2 * np.pi * 2.5 * t)) + 0.05 * rng.standard_normal(n)
    return x.astype(np.float32)


def by_hand(hubert: HubertFeatures, audio: np.ndarray) -> list[np.ndarray]:
    """Ditto's online branch of inference.py written out: 1920 zeros in front, a 6480 chunk every 3200, zero-filled."""
    padded = np.concatenate([np.zeros(1920, np.float32), audio])
    out = []
    for s in range(0, len(padded), 3200):
        window = padded[s:s + 6480]
        out.append(hubert.chunk(np.pad(window, (0, 6480 - len(window)))))
    return out


def run_stream(hubert: HubertFeatures, audio: np.ndarray, sizes: list[int]) -> tuple[list, list]:
    """Feed `audio` in pieces of the given sizes (the rest at once) -> (items from feeds, items from flush)."""
    stream, fed, at = StreamFeatures(hubert), [], 0
    for size in sizes:
        fed += stream.feed(audio[at:at + size])
        at += size
        assert len(stream._held) < 6480                      # only the samples a chunk still needs
    fed += stream.feed(audio[at:])
    flushed = stream.flush()
    assert stream.chunks_out == len(fed) + len(flushed)
    return fed, flushed


def test_constants_are_dittos_chunking():
    assert (STREAM_PAD_FRONT, CHUNK_HOP, CHUNK_LOOKAHEAD) == (1920, 3200, 1360)
    assert STREAM_PAD_FRONT + CHUNK_HOP + CHUNK_LOOKAHEAD == 6480


@pytest.mark.parametrize("n", [0, 1, 1279, 1280, 4560, 4561, 16000 * 2 + 77])
def test_flush_gives_dittos_chunk_count(hubert, n):
    fed, flushed = run_stream(hubert, speech_like(n, seed=n), [])
    assert len(fed) + len(flushed) == len(range(0, n + 1920, 3200))
    # a chunk is made while feeding as soon as its 6480 padded samples are there: 1360 past its own 3200
    assert len(fed) == max(0, (n + 1920 - 6480) // 3200 + 1)
    assert all(item.shape == (5, 32) and item.dtype == np.float32 for item in fed + flushed)


def test_random_pieces_equal_one_feed_and_dittos_loop(hubert):
    audio = speech_like(16000 * 2 + 555, seed=7)
    whole_fed, whole_flushed = run_stream(hubert, audio, [])
    whole = whole_fed + whole_flushed
    ref = by_hand(hubert, audio)
    assert len(whole) == len(ref) == 11              # ceil((32555 + 1920) / 3200)
    for got, want in zip(whole, ref):
        np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng(0)
    for _ in range(3):
        sizes = rng.integers(0, 5000, size=20).tolist()
        fed, flushed = run_stream(hubert, audio, sizes)
        assert len(fed) == len(whole_fed)
        for got, want in zip(fed + flushed, whole):
            np.testing.assert_array_equal(got, want)
    assert not np.allclose(whole[3], whole[4])               # the items differ: a mix-up would show


def test_a_chunk_is_the_encoder_output_pooled(hubert, tiny_hubert_dir):
    window = speech_like(6480, seed=3)
    model = HubertModel.from_pretrained(tiny_hubert_dir, local_files_only=True).eval()
    with torch.no_grad():
        enc = model(torch.from_numpy(window)[None]).last_hidden_state[0].numpy()   # [20, 32]
    want = enc[-14:-4].reshape(5, 2, -1).mean(1)
    np.testing.assert_allclose(hubert.chunk(window), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="6480"):
        hubert.chunk(window[:6400])


def test_online_chunks_are_the_offline_windows_80_samples_later(hubert):
    """Ditto pads 1920 zeros online and 2000 offline: for audio starting with 80 zeros, online chunk k of the audio
    is offline rows 5k..5k+4 of the audio less those zeros (where the offline start has no float rounding)."""
    audio = speech_like(16000, seed=11)
    audio[:80] = 0
    online = np.concatenate(by_hand(hubert, audio))
    offline = hubert.features(audio[80:])
    exact = [k for k, s in enumerate(window_starts(len(offline))) if s == CHUNK_HOP * k]
    assert len(exact) >= 3
    for k in exact:
        np.testing.assert_allclose(online[5 * k:5 * k + 5], offline[5 * k:5 * k + 5], rtol=1e-4, atol=1e-5)


def test_feeding_after_flush_and_bad_shapes_are_refused(hubert):
    stream = StreamFeatures(hubert)
    with pytest.raises(ValueError, match="mono"):
        stream.feed(np.zeros((2, 100), np.float32))
    stream.flush()
    assert stream.flush() == []
    with pytest.raises(RuntimeError, match="flushed"):
        stream.feed(np.zeros(100, np.float32))
