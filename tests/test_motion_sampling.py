"""Window arithmetic, cross-fade, smoothing and seeding of the audio-length motion sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ditto_fast.avatar.plate import mirror_indices
from ditto_fast.motion.conditions import build_conditions, condition_parts, emotion_schedule, emotion_vector
from ditto_fast.motion.sampling import MotionSampler, centered_mean, window_starts
from ditto_fast.errors import CheckpointError, InputError, UsageError


@pytest.mark.parametrize("n", [1, 2, 79, 80, 81, 150, 151, 220, 221, 1000])
def test_windows_cover_every_frame(n):
    starts = window_starts(n)
    assert starts[0] == 0 and all(b - a == 70 for a, b in zip(starts, starts[1:]))
    assert starts[-1] + 80 >= n                      # covered
    assert len(starts) == 1 or starts[-2] + 80 < n   # and no window more than needed


class RecordingSampler:
    """A window sampler whose output is a known function of its inputs: cond_frame + cumulative cond."""

    def __init__(self):
        self.calls = []

    def __call__(self, cond_frame, cond, gen):
        self.calls.append((cond_frame.clone(), cond.clone()))
        noise = torch.randn(cond.shape[0], cond.shape[1], cond_frame.shape[1], generator=gen) * 1e-3
        return cond_frame[:, None, :] + cond[..., :1].cumsum(1) + noise


def test_sampler_stitches_windows_continuously():
    n, d = 300, 265
    cond = np.full((n, 4), 0.01, np.float32)
    rec = RecordingSampler()
    out = MotionSampler(rec, smooth_window=1)(cond, np.zeros(d, np.float32), torch.Generator().manual_seed(0))
    assert out.shape == (n, d)
    assert len(rec.calls) == len(window_starts(n))
    # the true motion is a ramp 0.01 * (frame + 1): each window continues from the last kept frame
    ramp = 0.01 * (np.arange(n) + 1)
    np.testing.assert_allclose(out[:, 0], ramp, atol=0.02)
    assert np.abs(np.diff(out[:, 0])).max() < 0.02     # no jump at window borders
    # second window conditioned on frame 69 of the first
    np.testing.assert_allclose(rec.calls[1][0].numpy()[0], out[69], atol=1e-2)


def test_last_window_pads_by_repeating_last_condition():
    rec = RecordingSampler()
    cond = np.arange(100, dtype=np.float32)[:, None].repeat(3, 1)
    MotionSampler(rec)(cond, np.zeros(8, np.float32), torch.Generator().manual_seed(0))
    last = rec.calls[-1][1].numpy()[0]
    assert last.shape == (80, 3)
    assert (last[30:] == 99).all() and last[29, 0] == 99 and last[0, 0] == 70


def test_same_seed_same_motion_other_seed_differs():
    cond = np.random.default_rng(0).normal(size=(90, 4)).astype(np.float32)
    run = lambda s: MotionSampler(RecordingSampler())(cond, np.zeros(16, np.float32), torch.Generator().manual_seed(s))
    assert np.array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


def test_smoothing_only_first_202_dims():
    x = np.random.default_rng(0).normal(size=(50, 265)).astype(np.float32)
    sm = centered_mean(x, 3)
    np.testing.assert_allclose(sm[10], x[9:12].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sm[0], (2 * x[0] + x[1]) / 3, rtol=1e-5, atol=1e-6)
    x80 = np.concatenate([x, x[:30]])
    rec = lambda cf, c, g: torch.from_numpy(x80[None].copy())
    out = MotionSampler(rec)(np.zeros((50, 2), np.float32), np.zeros(265, np.float32), torch.Generator())
    np.testing.assert_allclose(out[:, 202:], x[:, 202:])
    np.testing.assert_allclose(out[:, :202], centered_mean(x[:, :202], 3), rtol=1e-5, atol=1e-6)


def test_emotion_vectors_and_schedule(tmp_path):
    e = emotion_vector("neutral")
    assert e.shape == (8,) and e.argmax() == 4 and abs(e.sum() - 1) < 1e-6 and e[4] > 0.99
    mix = emotion_vector("happy+surprise")
    assert abs(mix[3] - mix[6]) < 1e-6 and mix[3] > 0.49
    with pytest.raises(UsageError, match="unknown emotion"):
        emotion_vector("grumpy")
    f = tmp_path / "emo.json"
    f.write_text('{"default": "neutral", "frames": {"10-19": "happy", "30-": "sad"}}')
    s = emotion_schedule(str(f), 40)
    assert s.shape == (40, 8) and s[:10].argmax(1).tolist() == [4] * 10
    assert s[10:20].argmax(1).tolist() == [3] * 10 and s[30:].argmax(1).tolist() == [5] * 10
    f.write_text('{"frames": {"10-99": "happy"}}')
    with pytest.raises(InputError, match="outside the 40 frames"):
        emotion_schedule(str(f), 40)
    f.write_text('{"colour": "blue"}')
    with pytest.raises(InputError, match="unknown key"):
        emotion_schedule(str(f), 40)


def test_condition_layout_and_mirror_loop():
    assert condition_parts(1103, 1024) == ("emotion", "eye_open", "eye_ball", "sc")
    assert condition_parts(1024 + 63, 1024) == ("sc",)
    with pytest.raises(CheckpointError):
        condition_parts(1024 + 5, 1024)
    assert mirror_indices(9, 3).tolist() == [0, 1, 2, 2, 1, 0, 0, 1, 2]
    assert mirror_indices(4, 1).tolist() == [0, 0, 0, 0]
    feats = np.ones((9, 16), np.float32)
    eo = np.arange(6, dtype=np.float32).reshape(3, 2)
    cond = build_conditions(feats, ("emotion", "eye_open", "eye_ball", "sc"), np.zeros((9, 8), np.float32),
                            eo, np.zeros((3, 6), np.float32), np.arange(63, dtype=np.float32))
    assert cond.shape == (9, 16 + 79)
    assert cond[:, 24:26].tolist() == eo[mirror_indices(9, 3)].tolist()
    assert (cond[:, -63:] == np.arange(63)).all()
