"""Window arithmetic, cross-fade, smoothing and seeding of the audio-length motion sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ditto_fast.media.timeline import mirror_indices
from ditto_fast.motion.conditions import build_conditions, condition_parts, emotion_schedule, emotion_vector
from ditto_fast.motion.sampling import MotionSampler, window_starts
from ditto_fast.core.smoothing import centred_mean, smooth_range
from ditto_fast.core.errors import CheckpointError, InputError, UsageError
from support import fake_window_sampler, window_loop_vectors


def _window_vectors() -> tuple[dict, object]:
    """The window-loop vectors and the fake LMDM that made them (skip when ../shared is absent)."""
    return window_loop_vectors("sampler_seed0.npz", "window-loop vectors")


def test_sampler_matches_dittos_window_loop_on_the_parity_vectors():
    vec, fake_lmdm = _window_vectors()
    sampler = MotionSampler(fake_window_sampler(fake_lmdm, {k: vec[k] for k in "ABc"}))
    assert len(vec["ns"]) >= 10
    for n in vec["ns"]:
        got = sampler(vec[f"cond_{n}"], vec[f"x0_{n}"], torch.Generator())
        ref = vec[f"motion_{n}"]
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 1e-4, f"{n} frames: max error {np.abs(got - ref).max():.3g}"


def _literal_loop(sample, cond, x0, window, overlap, k, dims):
    """Ditto's offline loop read literally: grow a list of frames, fuse, smooth the seam, smooth all at the end."""
    def smooth(seq, s, e):
        src = [f.copy() for f in seq]
        for i in range(s, e):
            lo, hi = max(0, i - k // 2), min(len(seq), i + k // 2 + 1)
            seq[i][:dims] = np.mean([f[:dims] for f in src[lo:hi]], axis=0)

    n, keep, seq, kp = len(cond), window - overlap, None, x0
    idx = 0
    while idx < n:
        chunk = list(cond[idx:idx + window])
        chunk += [chunk[-1]] * (window - len(chunk))
        pred = [f.astype(np.float32) for f in sample(kp, np.stack(chunk))]
        if seq is None:
            seq = pred
            smooth(seq, 0, len(seq))
        else:
            for j in range(overlap):
                a = np.float32(j / overlap)
                seq[len(seq) - overlap + j] = seq[len(seq) - overlap + j] * (1 - a) + pred[j] * a
            seq += pred[overlap:]
            smooth(seq, len(seq) - keep - overlap, len(seq) - keep + 1)
        kp = seq[len(seq) - overlap - 1]
        idx += keep
    seq = seq[:n]
    smooth(seq, 0, n)
    return np.stack(seq)


@pytest.mark.parametrize("window,overlap,k", [(80, 10, 3), (20, 4, 5), (12, 3, 1)])
def test_sampler_matches_a_literal_reading_of_the_loop(window, overlap, k):
    rng = np.random.default_rng(window)
    d, c = 30, 5
    a, b, bias = rng.normal(size=(d, d)) * 0.3, rng.normal(size=(c, d)) * 0.3, rng.normal(size=d)
    ramp = np.linspace(0, 1, window)[:, None]
    sample = lambda kp, cond: np.tanh(kp @ a)[None] + np.tanh(cond @ b) + ramp * bias
    sampler = MotionSampler(lambda cf, cond, g: torch.from_numpy(sample(cf.numpy()[0], cond.numpy()[0])[None]),
                            window=window, overlap=overlap, smooth_window=k, smooth_dims=20)
    for n in (1, 2, window - overlap, window - overlap + 1, window, window + 1, 3 * window + 7):
        cond = rng.normal(size=(n, c)).astype(np.float32)
        x0 = rng.normal(size=d).astype(np.float32)
        ref = _literal_loop(sample, cond, x0, window, overlap, k, 20)
        got = sampler(cond, x0, torch.Generator())
        np.testing.assert_allclose(got, ref, atol=1e-5, err_msg=f"{n} frames")


@pytest.mark.parametrize("n", [1, 2, 70, 71, 80, 140, 141, 150, 151, 1000])
def test_one_window_per_70_frames_while_frames_remain(n):
    starts = window_starts(n)
    assert starts == list(range(0, n, 70)) and len(starts) == -(-n // 70)


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
    assert len(rec.calls) == len(window_starts(n)) == 5
    ramp = 0.01 * (np.arange(n) + 1)
    np.testing.assert_allclose(out[:, 0], ramp, atol=0.02)
    assert np.abs(np.diff(out[:, 0])).max() < 0.02     # no jump at window borders
    np.testing.assert_allclose(rec.calls[1][0].numpy()[0], out[69], atol=1e-6)   # frame 69 conditions window 2


def test_seam_weights_run_from_zero_to_nine_tenths():
    calls = []

    def constant_per_window(cond_frame, cond, gen):
        calls.append(None)
        return torch.full((1, 80, 4), float(len(calls)))

    out = MotionSampler(constant_per_window, smooth_window=1)(np.zeros((150, 2), np.float32),
                                                              np.zeros(4, np.float32), torch.Generator())
    # window 1 covers 0..79, window 2 fades in over 70..79 with weights 0, 0.1, ..., 0.9
    np.testing.assert_allclose(out[70:80, 0], 1 + np.arange(10) / 10, atol=1e-6)
    assert (out[:70] == 1).all() and (out[80:140] == 2).all()


def test_first_window_is_smoothed_before_it_conditions_the_second():
    rng = np.random.default_rng(3)
    first = rng.normal(size=(80, 265)).astype(np.float32)
    calls = []

    def sampler(cond_frame, cond, gen):
        calls.append(cond_frame.numpy()[0].copy())
        return torch.from_numpy(first[None].copy())

    MotionSampler(sampler)(np.zeros((75, 2), np.float32), np.zeros(265, np.float32), torch.Generator())
    assert len(calls) == 2
    np.testing.assert_allclose(calls[1][:202], first[68:71, :202].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(calls[1][202:], first[69, 202:])


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


def test_centred_mean_shortens_its_window_at_the_ends():
    x = np.random.default_rng(0).normal(size=(50, 265)).astype(np.float32)
    sm = centred_mean(x, 3)
    np.testing.assert_allclose(sm[10], x[9:12].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sm[0], x[:2].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sm[-1], x[-2:].mean(0), rtol=1e-5, atol=1e-6)
    sm13 = centred_mean(x, 13)
    np.testing.assert_allclose(sm13[2], x[:9].mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sm13[25], x[19:32].mean(0), rtol=1e-5, atol=1e-6)
    part = x.copy()
    smooth_range(part, 10, 20, 3, dims=202)
    np.testing.assert_array_equal(part[:10], x[:10])
    np.testing.assert_array_equal(part[10:20, 202:], x[10:20, 202:])
    np.testing.assert_allclose(part[10:20, :202], sm[10:20, :202], rtol=1e-5, atol=1e-6)


def test_only_the_pose_dims_are_smoothed():
    x = np.random.default_rng(0).normal(size=(80, 265)).astype(np.float32)
    out = MotionSampler(lambda cf, c, g: torch.from_numpy(x[None].copy()))(
        np.zeros((50, 2), np.float32), np.zeros(265, np.float32), torch.Generator())
    np.testing.assert_array_equal(out[:, 202:], x[:50, 202:])
    assert not np.allclose(out[:, :202], x[:50, :202])


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


def test_emotion_schedule_inline_as_the_readme_shows(tmp_path):
    inline = '{"default": "neutral", "frames": {"0-49": "happy"}}'
    f = tmp_path / "emo.json"
    f.write_text(inline)
    s = emotion_schedule(inline, 60)
    np.testing.assert_array_equal(s, emotion_schedule(str(f), 60))
    assert s[:50].argmax(1).tolist() == [3] * 50 and s[50:].argmax(1).tolist() == [4] * 10
    for bad, pattern in (('{"default": "happy"', "not valid JSON"), ('{"mood": "happy"}', "unknown key"),
                         ('{"default": 3}', "'default' must be an emotion"), ('{"default": "grumpy"}', "unknown emotion"),
                         ('{"frames": {"0-99": "sad"}}', "outside the 60 frames")):
        with pytest.raises(UsageError, match=pattern) as e:
            emotion_schedule(bad, 60)
        assert str(e.value).startswith("--emotion") and "\n" not in str(e.value)
    with pytest.raises(UsageError, match="unknown emotion"):         # a label too long to be a file name
        emotion_schedule("x" * 5000, 60)


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
