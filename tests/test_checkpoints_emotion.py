"""The speech-emotion classifier's folder in a checkpoint set: written by init-random (tiny and the real one's large
XLSR shape), reported by `checkpoints info` and `doctor`, optional until `--emotion auto` asks for it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from ditto_fast.audio.emotion import LABELS, SpeechEmotion
from ditto_fast.checkpoints import EMOTION_DIRNAME, find_checkpoints
from ditto_fast.checkpoints.random_emotion import emotion_config_dict
from ditto_fast.checkpoints.random_hubert import RANDOM_MARK
from ditto_fast.core.errors import CheckpointError


def test_tiny_set_has_a_classifier_that_loads(tiny_checkpoints):
    cs = find_checkpoints(tiny_checkpoints)
    assert cs.emotion_dir == tiny_checkpoints / EMOTION_DIRNAME and cs.has_emotion()
    assert cs.require_emotion() == cs.emotion_dir and len(cs.emotion_fingerprint()) == 16
    model = SpeechEmotion.load(cs.emotion_dir)
    scores = model.scores(np.random.default_rng(0).standard_normal(16000).astype(np.float32))
    assert model.labels == LABELS and scores.shape == (7,) and abs(float(scores.sum()) - 1) < 1e-5


def test_full_size_is_the_large_xlsr_shape():
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = emotion_config_dict(tiny=False)
    assert cfg[RANDOM_MARK] is True and cfg["model_type"] == "wav2vec2"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["do_stable_layer_norm"]) == (1024, 24, True)
    assert [cfg["id2label"][str(i)] for i in range(7)] == list(LABELS)
    config = Wav2Vec2Config(**{k: v for k, v in cfg.items() if k not in ("model_type", RANDOM_MARK)})
    with torch.device("meta"):
        n = sum(p.numel() for p in Wav2Vec2Model(config).parameters())
    assert 300e6 < n < 330e6, n          # wav2vec2-large-xlsr-53: ~315M


def test_missing_classifier_is_named_only_when_asked_for(tiny_checkpoints, tmp_path, run_cli):
    root = tmp_path / "ck"
    shutil.copytree(tiny_checkpoints, root, ignore=shutil.ignore_patterns(EMOTION_DIRNAME))
    cs = find_checkpoints(root)                     # everything else is found as before
    assert not cs.has_emotion() and cs.emotion_fingerprint() == "missing"
    with pytest.raises(CheckpointError, match="speech-emotion model directory missing") as e:
        cs.require_emotion()
    assert str(root / EMOTION_DIRNAME) in str(e.value) and "init-random" in str(e.value)
    r = run_cli(["checkpoints", "info", "--checkpoints", str(root)])
    assert r.returncode == 0 and f"{root / EMOTION_DIRNAME} not found: optional" in r.stdout
    r = run_cli(["doctor", "--checkpoints", str(root)], {"DITTO_FAST_HOME": str(tmp_path / "home")})
    assert r.returncode == 0 and "no speech-emotion classifier" in r.stdout, r.stdout + r.stderr


def test_info_and_doctor_report_it(tiny_checkpoints, tmp_path, run_cli):
    r = run_cli(["checkpoints", "info", "--checkpoints", str(tiny_checkpoints)])
    assert r.returncode == 0
    line = next(s for s in r.stdout.splitlines() if s.startswith("speech-emotion"))
    assert str(tiny_checkpoints / EMOTION_DIRNAME) in line
    r = run_cli(["doctor", "--checkpoints", str(tiny_checkpoints)], {"DITTO_FAST_HOME": str(tmp_path)})
    assert "six networks + HuBERT + speech-emotion loaded" in r.stdout, r.stdout + r.stderr
    broken = tmp_path / "ck"
    shutil.copytree(tiny_checkpoints, broken)
    (broken / EMOTION_DIRNAME / "model.safetensors").write_bytes(b"not weights")
    r = run_cli(["doctor", "--checkpoints", str(broken)], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 6 and "speech-emotion" in r.stdout, r.stdout
