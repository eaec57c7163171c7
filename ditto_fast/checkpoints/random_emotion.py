"""Write the speech-emotion classifier's folder with random weights (r-f/wav2vec-english-speech-emotion-recognition
layout, or tiny), for `checkpoints init-random`.

The real folder is a Wav2Vec2ForSpeechClassification fine-tuned from the large XLSR wav2vec2 (24 layers, 1024 wide,
stable layer norm): config.json with FLOAT's seven labels and mean pooling, and weights keyed `wav2vec2.*` (the
positional conv's weight norm as weight_g / weight_v) plus `classifier.dense` and `classifier.out_proj`. Written
here as model.safetensors; config.json carries "ditto_fast_random_weights": true. Weights come from a
torch.Generator seeded with `seed` only.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ditto_fast.checkpoints import EMOTION_LABELS
from ditto_fast.checkpoints.random_hubert import RANDOM_MARK, random_config, write_random_folder

# the large XLSR wav2vec2 shape, as r-f/wav2vec-english-speech-emotion-recognition's config.json gives it
SER_LARGE_CONFIG: dict = {
    "architectures": ["Wav2Vec2ForSpeechClassification"],
    "model_type": "wav2vec2",
    "activation_dropout": 0.05,
    "apply_spec_augment": True,
    "attention_dropout": 0.1,
    "bos_token_id": 1,
    "conv_bias": True,
    "conv_dim": [512, 512, 512, 512, 512, 512, 512],
    "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    "conv_stride": [5, 2, 2, 2, 2, 2, 2],
    "do_stable_layer_norm": True,
    "eos_token_id": 2,
    "feat_extract_activation": "gelu",
    "feat_extract_norm": "layer",
    "feat_proj_dropout": 0.05,
    "final_dropout": 0.0,
    "finetuning_task": "wav2vec2_clf",
    "hidden_act": "gelu",
    "hidden_dropout": 0.05,
    "hidden_size": 1024,
    "id2label": {str(i): n for i, n in enumerate(EMOTION_LABELS)},
    "label2id": {n: i for i, n in enumerate(EMOTION_LABELS)},
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "layerdrop": 0.05,
    "mask_time_length": 10,
    "mask_time_prob": 0.05,
    "num_attention_heads": 16,
    "num_conv_pos_embedding_groups": 16,
    "num_conv_pos_embeddings": 128,
    "num_feat_extract_layers": 7,
    "num_hidden_layers": 24,
    "pad_token_id": 0,
    "pooling_mode": "mean",
    "problem_type": "single_label_classification",
    "vocab_size": 33,
}


def emotion_config_dict(tiny: bool) -> dict:
    """The config.json content for the full (large XLSR) or tiny random classifier."""
    return random_config(SER_LARGE_CONFIG, tiny)


def write_random_emotion(out_dir: str | os.PathLike, tiny: bool, seed: int) -> Path:
    """Write config.json + model.safetensors (a random speech-emotion classifier) into out_dir; returns out_dir."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_dict = emotion_config_dict(tiny)
    skip = ("model_type", RANDOM_MARK, "pooling_mode", "finetuning_task")
    config = Wav2Vec2Config(**{k: v for k, v in cfg_dict.items() if k not in skip})
    with torch.device("meta"):  # shapes only: no memory, no global RNG
        shapes = {f"wav2vec2.{k}": tuple(v.shape) for k, v in Wav2Vec2Model(config).state_dict().items()}
    hidden, labels = int(cfg_dict["hidden_size"]), len(EMOTION_LABELS)
    shapes.update({"classifier.dense.weight": (hidden, hidden), "classifier.dense.bias": (hidden,),
                   "classifier.out_proj.weight": (labels, hidden), "classifier.out_proj.bias": (labels,)})
    write_random_folder(out_dir, cfg_dict, shapes, int(seed) * 1000 + 77)
    return out_dir
