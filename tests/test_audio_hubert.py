"""HuBERT features: Ditto's windowing, batched == one window at a time, checkpoint loading and errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import HubertConfig, HubertForCTC, HubertModel

from ditto_fast.audio.hubert import HubertFeatures, load_hubert_encoder, window_starts
from ditto_fast.core.errors import CheckpointError
from ditto_fast.checkpoints.random_hubert import RANDOM_MARK, hubert_config_dict, write_random_hubert
from reference import hubert_features_one_by_one


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="session")
def tiny_features(tiny_hubert_dir):
    return HubertFeatures(tiny_hubert_dir, batch_size=4)


def speech_like(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    x = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.standard_normal(n)
    return x.astype(np.float32)


def ditto_reference(model: HubertModel, audio: np.ndarray) -> np.ndarray:
    """Ditto's offline loop written out literally (float frame count aside): one window per call."""
    num_f = -(-len(audio) // 640)
    split_len = int((3 + 5 + 2) * 0.04 * 16000) + 80
    pad = np.concatenate([np.zeros(split_len - int((5 + 2) * 0.04 * 16000), np.float32), audio,
                          np.zeros(split_len, np.float32)])
    out, i = [], 0
    with torch.no_grad():
        while i < num_f:
            s = int(i * 0.04 * 16000)
            enc = model(torch.from_numpy(pad[s:s + split_len])[None]).last_hidden_state[0].numpy()
            out.append(enc[-14:-4].reshape(5, 2, -1).mean(1))
            i += 5
    return np.concatenate(out)[:num_f]


@pytest.mark.parametrize("n", [1, 639, 640, 641, 3200, 3201, 6480, 9599, 16000, 16000 * 3 + 17])
def test_rows_and_batching(tiny_features, n):
    audio = speech_like(n, seed=n)
    feats = tiny_features(audio)
    assert feats.shape == (-(-n // 640), 32) and feats.dtype == np.float32
    assert np.isfinite(feats).all()
    single = hubert_features_one_by_one(tiny_features, audio)
    np.testing.assert_allclose(feats, single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 3, 16, 100])
def test_batched_equals_ditto_loop(tiny_features, batch_size):
    audio = speech_like(16000 * 2 + 333, seed=5)
    ref = ditto_reference(tiny_features.model, audio)
    got = tiny_features.features(audio, batch_size=batch_size)
    assert got.shape == ref.shape == (51, 32)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_features_depend_on_time(tiny_features):
    """Each 25 fps row sees its own stretch of audio: a click moves the rows that change."""
    base = np.zeros(16000, np.float32)
    click = base.copy()
    click[8000:8160] = 0.8  # frame 12.5
    diff = np.abs(tiny_features(click) - tiny_features(base)).max(axis=1)
    assert diff[12] > 1e-3
    assert diff[0] < 1e-6 and diff[-1] < 1e-6


@pytest.mark.slow
def test_off_grid_windows_past_64_seconds(tiny_features):
    """Ditto's float rounding starts window i=1615 one sample early; batched and Ditto's loop agree there."""
    n = 1700 * 640 - 123
    audio = speech_like(n, seed=11)
    got = tiny_features.features(audio, batch_size=16)
    ref = ditto_reference(tiny_features.model, audio)
    assert got.shape == ref.shape == (1700, 32)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    shifted = audio.copy()
    shifted[1:] = audio[:-1]  # what a window started on the 640-sample grid would see instead
    assert np.abs(got[1615:1620] - ditto_reference(tiny_features.model, shifted)[1615:1620]).max() > 1e-4


def test_fused_weight_norm_is_exact(tiny_hubert_dir, tiny_features):
    conv = load_hubert_encoder(tiny_hubert_dir).encoder.pos_conv_embed.conv
    fused = tiny_features.model.encoder.pos_conv_embed.conv
    assert "weight" in dict(fused.named_parameters()) and not hasattr(fused, "parametrizations")
    assert "encoder.pos_conv_embed.conv.weight" in tiny_features.model.state_dict()
    torch.testing.assert_close(fused.weight, conv.weight.detach(), rtol=1e-6, atol=1e-7)


def test_silence_and_float64(tiny_features):
    feats = tiny_features(np.zeros(4000))
    assert feats.shape == (7, 32) and np.isfinite(feats).all()


def test_window_starts_follow_ditto_float_rounding():
    starts = window_starts(1700)
    assert starts[0] == 0 and starts[1] == 3200
    assert list(starts) == [int(i * 0.04 * 16000) for i in range(0, 1700, 5)]
    assert starts[1615 // 5] == 1615 * 640 - 1  # Ditto's float rounding, kept on purpose


def test_ctc_dir_loads_encoder_weights(tiny_hubert_dir, tiny_features):
    saved = load_file(str(tiny_hubert_dir / "model.safetensors"))
    assert all(k.startswith(("hubert.", "lm_head.")) for k in saved)
    assert "hubert.encoder.pos_conv_embed.conv.weight_g" in saved  # published checkpoint naming
    enc = load_hubert_encoder(tiny_hubert_dir).state_dict()
    for key, value in enc.items():
        name = ("hubert." + key).replace("parametrizations.weight.original0", "weight_g") \
                                .replace("parametrizations.weight.original1", "weight_v")
        assert torch.equal(value, saved[name]), key
    audio = speech_like(16000, seed=3)
    ctc = HubertForCTC.from_pretrained(tiny_hubert_dir, local_files_only=True).eval()
    np.testing.assert_allclose(tiny_features(audio), ditto_reference(ctc.hubert, audio), rtol=1e-4, atol=1e-5)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        fresh = HubertModel(HubertConfig.from_pretrained(tiny_hubert_dir)).eval()
    assert np.abs(ditto_reference(fresh, audio) - tiny_features(audio)).max() > 1e-2


def test_plain_hubertmodel_dir_loads(tiny_hubert_dir, tiny_features, tmp_path):
    load_hubert_encoder(tiny_hubert_dir).save_pretrained(tmp_path / "enc")
    other = HubertFeatures(tmp_path / "enc")
    audio = speech_like(5000, seed=9)
    np.testing.assert_allclose(other(audio), tiny_features(audio), rtol=1e-5, atol=1e-6)


def test_random_writer_is_deterministic(tiny_hubert_dir, tmp_path):
    again = load_file(str(write_random_hubert(tmp_path / "a", tiny=True, seed=0) / "model.safetensors"))
    first = load_file(str(tiny_hubert_dir / "model.safetensors"))
    other = load_file(str(write_random_hubert(tmp_path / "b", tiny=True, seed=1) / "model.safetensors"))
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["hubert.encoder.layers.0.attention.q_proj.weight"],
                           other["hubert.encoder.layers.0.attention.q_proj.weight"])
    cfg = json.loads((tiny_hubert_dir / "config.json").read_text())
    assert cfg[RANDOM_MARK] is True and cfg["model_type"] == "hubert"
    assert cfg["architectures"] == ["HubertForCTC"] and cfg["vocab_size"] == 32


def test_full_config_is_hubert_large():
    cfg = hubert_config_dict(tiny=False)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["intermediate_size"]) == (1024, 24, 16, 4096)
    assert cfg["feat_extract_norm"] == "layer" and cfg["do_stable_layer_norm"] and cfg["conv_bias"]
    config = HubertConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", RANDOM_MARK)})
    with torch.device("meta"):
        model = HubertModel(config)
    assert int(model._get_feat_extract_output_lengths(6480)) == 20
    n_params = sum(p.numel() for p in model.parameters())
    assert 310e6 < n_params < 320e6  # hubert-large: ~315M encoder parameters
    tiny = HubertConfig(**{k: v for k, v in hubert_config_dict(True).items() if k not in ("model_type", RANDOM_MARK)})
    assert tiny.conv_kernel == config.conv_kernel and tiny.conv_stride == config.conv_stride


# ---------------------------------------------------------------- checkpoint errors


def _broken(kind: str, src, tmp_path):
    d = tmp_path / kind
    if kind == "missing":
        return d
    if kind == "file":
        d.write_text("x")
        return d
    shutil.copytree(src, d)
    cfg_path = d / "config.json"
    if kind == "no_config":
        cfg_path.unlink()
    elif kind == "bad_json":
        cfg_path.write_text("{not json")
    elif kind == "other_model":
        cfg = json.loads(cfg_path.read_text())
        cfg["model_type"] = "wav2vec2"
        cfg_path.write_text(json.dumps(cfg))
    elif kind == "no_weights":
        (d / "model.safetensors").unlink()
    elif kind == "truncated":
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        (d / "model.safetensors").write_bytes(b"\x00" * 4096)
    elif kind == "incomplete":
        sd = load_file(str(d / "model.safetensors"))
        del sd["hubert.encoder.layers.1.attention.q_proj.weight"]
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    elif kind == "wrong_shapes":
        cfg = json.loads(cfg_path.read_text())
        cfg["intermediate_size"] = 48
        cfg_path.write_text(json.dumps(cfg))
    else:
        raise AssertionError(kind)
    return d


@pytest.mark.parametrize("kind", ["missing", "file", "no_config", "bad_json", "other_model", "no_weights",
                                  "truncated", "garbage", "incomplete", "wrong_shapes"])
def test_checkpoint_errors(tiny_hubert_dir, tmp_path, kind):
    d = _broken(kind, tiny_hubert_dir, tmp_path)
    with pytest.raises(CheckpointError) as info:
        load_hubert_encoder(d)
    msg = str(info.value)
    assert "\n" not in msg and str(d) in msg
