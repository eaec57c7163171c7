"""`--emotion auto`'s track: classes mapped by name, silence held, a low-pass and hysteresis so that a switch takes a
known number of frames and no class flickers; the `auto` labels and mixes an --emotion value may say."""

from __future__ import annotations

import numpy as np
import pytest

from ditto_fast.checkpoints import EMOTION_LABELS
from ditto_fast.core.errors import UsageError
from ditto_fast.motion.conditions import emotion_plan, emotion_schedule, emotion_vector, neutral_blend
from ditto_fast.motion.emotion_track import (AutoEmotion, crossfade, emotion_track, hold_through_silence,
                                             hysteresis, low_pass, to_ditto_classes)
from ditto_fast.motion.emotions import EMOTIONS

RATE = 25.0
VECTORS = np.stack([emotion_vector(e) for e in EMOTIONS])
HAPPY, SAD, NEUTRAL = EMOTIONS.index("happy"), EMOTIONS.index("sad"), EMOTIONS.index("neutral")


def _scores(rows: list[dict[str, float]]) -> np.ndarray:
    """[W, 7] probabilities in FLOAT's order from {label: p} rows (the rest share what is left)."""
    out = np.zeros((len(rows), 7))
    for i, row in enumerate(rows):
        rest = (1 - sum(row.values())) / (7 - len(row))
        out[i] = [row.get(label, rest) for label in EMOTION_LABELS]
    return out


def test_floats_seven_go_onto_dittos_eight_by_name():
    probs = to_ditto_classes(_scores([{"happy": 0.7, "sad": 0.1}]), EMOTION_LABELS)
    assert probs.shape == (1, 8) and probs[0, EMOTIONS.index("contempt")] == 0
    assert probs[0, HAPPY] == pytest.approx(0.7) and probs[0, SAD] == pytest.approx(0.1)
    assert probs.sum() == pytest.approx(1.0)


def test_silence_keeps_the_last_emotion_neutral_before_any_speech():
    probs = to_ditto_classes(_scores([{"sad": 0.9}, {"happy": 0.9}, {"angry": 0.9}, {"fear": 0.9}]), EMOTION_LABELS)
    held = hold_through_silence(probs, np.array([False, True, False, False]))
    assert held[0].argmax() == NEUTRAL and held[0, NEUTRAL] == 1
    assert [int(r.argmax()) for r in held[1:]] == [HAPPY, HAPPY, HAPPY]


def test_a_switch_takes_the_fade_and_never_flickers():
    """A synthetic track: happy for 6 s then sad for 6 s, each window's reading noisy (the loser now and then
    ahead by a little). The face switches once, from happy to sad, near 6 s, over round(fade * rate) frames."""
    rng = np.random.default_rng(0)
    settings = AutoEmotion()
    centres = np.arange(0.5, 12.0, 0.25)                # a dense reading, so noise gets through the interpolation
    rows = []
    for t in centres:
        lead, other = ("happy", "sad") if t < 6 else ("sad", "happy")
        gap = rng.uniform(-0.15, 0.55)                  # about one window in five, the wrong class leads
        rows.append({lead: 0.45 + gap / 2, other: 0.45 - gap / 2})
    raw_leader = _scores(rows).argmax(1)
    assert (np.diff(raw_leader) != 0).sum() >= 5                        # the readings flicker ...
    n = int(12 * RATE)
    track = emotion_track(centres, _scores(rows), EMOTION_LABELS, np.zeros(len(centres)), n, RATE, VECTORS,
                          settings)
    assert track.switches() == 1                                        # ... the face switches once
    first_sad = int(np.flatnonzero(track.held == SAD)[0])
    assert abs(first_sad / RATE - 6.0) < settings.smooth, first_sad
    moving = np.flatnonzero(np.abs(np.diff(track.vectors, axis=0)).max(1) > 1e-6) + 1
    fade = round(settings.fade * RATE)
    assert moving.tolist() == list(range(first_sad, first_sad + fade)), moving  # the switch takes `fade` frames
    np.testing.assert_allclose(track.vectors[first_sad + fade - 1], VECTORS[SAD], atol=1e-6)
    np.testing.assert_allclose(track.vectors[:first_sad], np.tile(VECTORS[HAPPY], (first_sad, 1)), atol=1e-6)
    per_second = track.per_second()
    assert len(per_second) == 12 and per_second[0]["label"] == "happy" and per_second[-1]["label"] == "sad"
    assert set(per_second[0]["probabilities"]) == set(EMOTIONS)


def test_a_near_tie_holds_one_class():
    """Two classes trading the lead by less than the margin, or by more for less than the dwell: no switch."""
    t = np.arange(300)
    probs = np.zeros((300, 8))
    probs[:, HAPPY] = 0.45 + 0.05 * np.sin(t / 3)                       # within the margin, every few frames
    probs[:, SAD] = 0.45 - 0.05 * np.sin(t / 3)
    assert len(set(hysteresis(probs, 0.15, 25).tolist())) == 1
    blips = np.zeros((300, 8))
    blips[:, HAPPY] = 0.8
    blips[:, SAD] = 0.1
    for start in range(20, 300, 40):                                    # sad ahead by a lot, for 20 frames at a time
        blips[start:start + 20, [HAPPY, SAD]] = [0.1, 0.8]
    assert set(hysteresis(blips, 0.15, 25).tolist()) == {HAPPY}
    blips[200:, [HAPPY, SAD]] = [0.1, 0.8]                              # then for good (the blip at 180 runs on)
    held = hysteresis(blips, 0.15, 25)
    assert held[179] == HAPPY and held[180] == SAD and (np.diff(held) != 0).sum() == 1    # dated from its lead


def test_low_pass_and_crossfade_shapes():
    x = np.zeros((10, 2))
    x[5:, 0] = 1
    y = low_pass(x, 3)
    assert y.shape == x.shape and y[4, 0] == pytest.approx(1 / 3) and y[5, 0] == pytest.approx(2 / 3)
    held = np.array([0, 0, 1, 1, 1, 1, 0, 0])
    v = crossfade(held, np.eye(2), 3)
    np.testing.assert_allclose(v[:, 1], [0, 0, 1 / 3, 2 / 3, 1, 1, 2 / 3, 1 / 3])


def test_auto_in_labels_mixes_and_schedules():
    fixed, share = emotion_plan("auto", 4)
    assert share.tolist() == [1, 1, 1, 1] and not fixed.any()
    fixed, share = emotion_plan("auto+happy", 4)
    assert share.tolist() == [0.5] * 4
    np.testing.assert_allclose(fixed[0], 0.5 * emotion_vector("happy"))
    fixed, share = emotion_plan('{"default": "neutral", "frames": {"2-3": "auto"}}', 4)
    assert share.tolist() == [0, 0, 1, 1]
    np.testing.assert_allclose(fixed[0], emotion_vector("neutral"))
    fixed, share = emotion_plan("sad", 4)
    assert share is None
    np.testing.assert_array_equal(emotion_schedule("sad", 4), fixed)
    with pytest.raises(UsageError, match="auto"):
        emotion_schedule("auto", 4)                 # what cannot read speech says so
    with pytest.raises(UsageError, match="unknown emotion"):
        emotion_plan("auto+auto", 4)
    with pytest.raises(UsageError, match="auto .read from the speech."):
        emotion_plan("grumpy", 4)


def test_strength_blends_toward_neutral():
    happy = emotion_vector("happy")
    np.testing.assert_array_equal(neutral_blend(happy, 1.0), happy)
    np.testing.assert_allclose(neutral_blend(happy, 0.0), emotion_vector("neutral"), atol=1e-7)
    np.testing.assert_allclose(neutral_blend(happy, 0.25), 0.25 * happy + 0.75 * emotion_vector("neutral"),
                               atol=1e-7)


def test_live_takes_a_strength_and_refuses_auto():
    from ditto_fast.core.config import load_config
    from ditto_fast.live.options import LiveRequest

    config = load_config(None)
    got = LiveRequest(avatar="anchor", emotion="happy", emotion_strength=0.5).settings(config).emotion
    np.testing.assert_allclose(got, neutral_blend(emotion_vector("happy"), 0.5))
    with pytest.raises(UsageError, match="goes with renders"):
        LiveRequest(avatar="anchor", emotion="auto").settings(config)
