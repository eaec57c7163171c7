"""The speech-emotion classifier (FLOAT's Audio2Emotion) against FLOAT's own outputs (../parity "Speech-emotion
vectors"), its windows, and the folders it refuses."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import PARITY
from ditto_fast.audio.emotion import LABELS, SpeechEmotion, normalise, window_starts
from ditto_fast.core.errors import CheckpointError

EMOTION_PARITY = PARITY / "emotion_seed0"


@pytest.fixture(scope="module")
def vectors() -> dict:
    if not (EMOTION_PARITY / "emotion_vectors.npz").is_file():
        pytest.skip(f"speech-emotion parity files not found at {EMOTION_PARITY}")
    with np.load(EMOTION_PARITY / "emotion_vectors.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def models(vectors) -> dict:
    return {name: SpeechEmotion.load(EMOTION_PARITY / name) for name in ("ser0", "ser1")}


def test_labels_are_floats_seven_in_its_order(vectors, models):
    assert tuple(vectors["labels"]) == LABELS
    assert all(m.labels == LABELS for m in models.values())


@pytest.mark.parametrize("model", ["ser0", "ser1"])   # stable layer norm + .bin; group norm + .safetensors
def test_scores_match_floats_audio2emotion(vectors, models, model):
    cases = [c for c in vectors["cases"] if c.startswith(model + "_")]
    assert len(cases) == 3
    for case in cases:
        got = models[model].scores(vectors[f"{case}_audio"])            # raw audio: normalised inside
        assert got.shape == (7,) and abs(float(got.sum()) - 1) < 1e-5
        log_scores = np.log(got.astype(np.float64))
        logits = vectors[f"{case}_logits"].astype(np.float64)
        err = np.abs((log_scores - log_scores.mean()) - (logits - logits.mean())).max()
        assert err < 1e-3, (case, err)
        np.testing.assert_allclose(got, vectors[f"{case}_scores"], atol=1e-4)


def test_the_normalisation_is_floats(vectors, models):
    audio = vectors["ser0_1.3s_audio"]
    x = normalise(audio)
    assert abs(float(x.mean())) < 1e-6 and abs(float(x.std()) - 1) < 1e-4
    # a louder recording of the same speech reads the same; without the normalisation it would not
    np.testing.assert_allclose(models["ser0"].scores(audio * 8 + 0.01), models["ser0"].scores(audio), atol=1e-4)


def test_windows_are_whole_and_cover_the_signal():
    assert window_starts(10, 64, 32).tolist() == [0]
    assert window_starts(64, 64, 32).tolist() == [0]
    assert window_starts(100, 64, 32).tolist() == [0, 32, 36]          # the last one ends at the signal's end
    assert window_starts(128, 64, 32).tolist() == [0, 32, 64]


def test_batched_windows_equal_one_at_a_time(vectors, models):
    audio = vectors["ser1_3.0s_audio"]
    seen = []
    got = models["ser1"].windows(audio, 1.0, 0.5, batch_size=2, progress=lambda d, n: seen.append((d, n)))
    assert got.starts.tolist() == [0, 8000, 16000, 24000, 32000] and got.length == 16000
    assert seen[-1] == (5, 5) and len(seen) == 3
    for start, row in zip(got.starts, got.scores):
        np.testing.assert_allclose(row, models["ser1"].scores(audio[start:start + 16000]), atol=1e-5)
    np.testing.assert_allclose(got.centres, [0.5, 1.0, 1.5, 2.0, 2.5])
    silent = models["ser1"].windows(np.zeros(8000, np.float32), 1.0, 0.5)
    assert silent.starts.tolist() == [0] and silent.length == 8000 and silent.rms_db[0] < -150


def test_folders_it_refuses(tmp_path, vectors, tiny_hubert_dir):
    with pytest.raises(CheckpointError, match="speech-emotion model directory not found") as e:
        SpeechEmotion.load(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(e.value)
    with pytest.raises(CheckpointError, match="model_type is 'hubert', not 'wav2vec2'"):
        SpeechEmotion.load(tiny_hubert_dir)
    bare = tmp_path / "bare"
    shutil.copytree(EMOTION_PARITY / "ser1", bare)
    from safetensors.torch import load_file, save_file

    state = load_file(bare / "model.safetensors")
    save_file({k: v for k, v in state.items() if not k.startswith("classifier.")}, bare / "model.safetensors")
    with pytest.raises(CheckpointError, match="no classifier head"):
        SpeechEmotion.load(bare)
    other = tmp_path / "other"
    shutil.copytree(EMOTION_PARITY / "ser1", other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["id2label"] = {str(i): n for i, n in enumerate(["calm", *LABELS[1:]])}
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="not FLOAT's"):
        SpeechEmotion.load(other)


def test_a_legacy_pickle_bin_loads_the_same(vectors, models, tmp_path):
    """A pytorch_model.bin in torch's pre-zip format (older downloads) cannot be memory-mapped: read whole."""
    import torch

    folder = tmp_path / "legacy"
    shutil.copytree(EMOTION_PARITY / "ser0", folder)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    torch.save(state, folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    audio = vectors["ser0_1.3s_audio"]
    np.testing.assert_array_equal(SpeechEmotion.load(folder).scores(audio), models["ser0"].scores(audio))
