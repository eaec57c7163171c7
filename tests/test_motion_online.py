"""The streaming motion sampler against Ditto's live-mode worker: values, when frames come out, d0, bounded memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ditto_fast.motion.sampling import OnlineMotionSampler
from support import fake_window_sampler, window_loop_vectors


@pytest.fixture(scope="module")
def online_vectors() -> tuple[dict, object]:
    """The streaming-loop vectors and the fake LMDM that made them (skip when ../shared is absent)."""
    return window_loop_vectors("online_seed0.npz", "streaming-loop vectors")


CASES = ["ov70_k5_n1", "ov70_k5_n3", "ov70_k5_n40", "ov75_k5_n2", "ov75_k5_n57", "ov72_k5_n33", "ov10_k5_n30",
         "ov70_k3_n29", "ov75_k7_n19", "ov60_k5_n64"]


def test_the_vectors_hold_the_cases_tested(online_vectors):
    vec, _ = online_vectors
    assert sorted(vec["cases"].tolist()) == sorted(CASES)


@pytest.mark.parametrize("name", CASES)
def test_stream_matches_dittos_live_worker(online_vectors, name):
    vec, fake_lmdm = online_vectors
    overlap = int(name.split("_")[0][2:])
    sampler = OnlineMotionSampler(fake_window_sampler(fake_lmdm, {k: vec[k] for k in "ABc"}), overlap=overlap)
    sampler.start(vec[f"{name}_x0"], vec[f"{name}_prefill"], torch.Generator())
    assert sampler.d0 is None
    got = [sampler.push(item) for item in vec[f"{name}_items"]]
    got.append(sampler.finish())
    assert [len(g) for g in got] == vec[f"{name}_counts"].tolist()
    frames = np.concatenate(got, 0)
    ref = vec[f"{name}_frames"].reshape(-1, 265)
    assert frames.shape == ref.shape and sampler.frames_out == len(ref)
    if len(ref):
        assert np.abs(frames - ref).max() <= 1e-4, f"{name}: max error {np.abs(frames - ref).max():.3g}"
    np.testing.assert_allclose(sampler.d0, vec[f"{name}_d0"], atol=1e-4)
    # emitted frame i stands for pushed row i + max(0, 80 - 2 * overlap); the final padding may add a few more
    rows = vec[f"{name}_items"].shape[0] * vec[f"{name}_items"].shape[1]
    lag = max(0, 80 - 2 * overlap)
    expected_real = 0 if overlap + rows < 80 else rows - lag     # a lone first window emits nothing
    assert sampler.rows_in == rows and sampler.real_frames == expected_real <= len(ref)


def test_frames_stand_for_the_rows_pushed_and_padding_is_counted():
    """A sampler whose motion echoes its conditions shows which pushed row each emitted frame stands for."""
    echo = lambda cf, cond, gen: cond.repeat(1, 1, 2)[..., :8]           # [1, 80, C=4] -> [1, 80, 8]
    for overlap in (70, 60, 40, 30, 10):
        sampler = OnlineMotionSampler(echo, overlap=overlap, smooth_window=1)
        sampler.start(np.zeros(8, np.float32), np.full((overlap, 4), -1, np.float32), torch.Generator())
        rows = np.arange(203, dtype=np.float32)[:, None].repeat(4, 1)
        out = np.concatenate([sampler.push(rows[i:i + 5]) for i in range(0, 203, 5)] + [sampler.finish()], 0)
        lag = max(0, 80 - 2 * overlap)
        real = sampler.real_frames
        assert real == 203 - lag and len(out) >= real
        np.testing.assert_allclose(out[:real, 0], np.arange(lag, 203), atol=1e-4)   # fused: x(1-a) + x a
        np.testing.assert_allclose(out[real:, 0], 202, atol=1e-4)      # past the end: the last row repeated


def test_memory_stays_bounded_over_a_long_stream():
    calls = []

    def sampler_fn(cond_frame, cond, gen):
        calls.append(None)
        return torch.randn(1, cond.shape[1], cond_frame.shape[1], generator=gen) * 0.01 + cond_frame[:, None]

    sampler = OnlineMotionSampler(sampler_fn, overlap=75)
    rng = np.random.default_rng(0)
    sampler.start(np.zeros(265, np.float32), np.zeros((75, 16), np.float32), torch.Generator().manual_seed(0))
    emitted = 0
    for _ in range(2000):
        emitted += len(sampler.push(rng.normal(size=(5, 16)).astype(np.float32)))
        assert len(sampler._feats) <= 160 and len(sampler._res) <= 160 and len(sampler._pending) < 5
    assert emitted == 2000 * 5 - 5 and len(calls) == 2000               # one window per item; the last still held
    assert np.isfinite(sampler.finish()).all()


def test_one_stream_at_a_time_and_a_fresh_start_repeats_it():
    fn = lambda cf, cond, gen: cf[:, None].repeat(1, cond.shape[1], 1) + cond.sum(-1, keepdim=True)
    sampler = OnlineMotionSampler(fn, overlap=70)
    with pytest.raises(RuntimeError, match="start"):
        sampler.push(np.zeros((5, 3), np.float32))
    feats = np.random.default_rng(1).normal(size=(60, 3)).astype(np.float32)

    def run():
        sampler.start(np.ones(6, np.float32), np.zeros((70, 3), np.float32), torch.Generator())
        return np.concatenate([sampler.push(feats[i:i + 5]) for i in range(0, 60, 5)] + [sampler.finish()], 0)

    first = run()
    with pytest.raises(RuntimeError, match="finished"):
        sampler.push(feats[:5])
    np.testing.assert_array_equal(run(), first)


@pytest.mark.parametrize("overlap", [0, -3, 80, 95])
def test_overlap_out_of_range_is_refused(overlap):
    with pytest.raises(ValueError, match="overlap"):
        OnlineMotionSampler(lambda *a: None, overlap=overlap)


def test_bad_prefill_and_feature_shapes_are_refused():
    sampler = OnlineMotionSampler(lambda *a: None, overlap=70)
    with pytest.raises(ValueError, match="prefill"):
        sampler.start(np.zeros(265, np.float32), np.zeros((69, 12), np.float32), torch.Generator())
    sampler.start(np.zeros(265, np.float32), np.zeros((70, 12), np.float32), torch.Generator())
    with pytest.raises(ValueError, match="features"):
        sampler.push(np.zeros((5, 11), np.float32))
