"""Write a transformers HuBERT directory with random weights (hubert-large-ls960-ft layout, or tiny).

The files look like the real facebook/hubert-large-ls960-ft download: config.json of a
HubertForCTC (vocab 32), its vocab.json (the head's characters) and model.safetensors holding "hubert."-prefixed
encoder weights plus the CTC head, with the positional conv's weight norm stored as weight_g / weight_v. config.json carries
"ditto_fast_random_weights": true. Weights come from a torch.Generator seeded with `seed` only.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from ditto_fast.media.filemode import give_usual_mode

RANDOM_MARK = "ditto_fast_random_weights"
# facebook/hubert-large-ls960-ft's vocab.json: the CTC head's 32 symbols (blank = <pad>, "|" between words)
CTC_VOCAB = ["<pad>", "<s>", "</s>", "<unk>", "|", *"ETAONIHSRDLUMWCFGYPBVK'XJQZ"]

# facebook/hubert-large-ls960-ft config.json (transformers HubertConfig fields)
HUBERT_LARGE_CONFIG: dict = {
    "architectures": ["HubertForCTC"],
    "model_type": "hubert",
    "activation_dropout": 0.1,
    "apply_spec_augment": True,
    "attention_dropout": 0.1,
    "bos_token_id": 1,
    "conv_bias": True,
    "conv_dim": [512, 512, 512, 512, 512, 512, 512],
    "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    "conv_stride": [5, 2, 2, 2, 2, 2, 2],
    "ctc_loss_reduction": "sum",
    "ctc_zero_infinity": False,
    "do_stable_layer_norm": True,
    "eos_token_id": 2,
    "feat_extract_activation": "gelu",
    "feat_extract_dropout": 0.0,
    "feat_extract_norm": "layer",
    "feat_proj_dropout": 0.1,
    "feat_proj_layer_norm": True,
    "final_dropout": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout": 0.1,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "layerdrop": 0.1,
    "mask_feature_length": 10,
    "mask_feature_prob": 0.0,
    "mask_time_length": 10,
    "mask_time_prob": 0.05,
    "num_attention_heads": 16,
    "num_conv_pos_embedding_groups": 16,
    "num_conv_pos_embeddings": 128,
    "num_feat_extract_layers": 7,
    "num_hidden_layers": 24,
    "pad_token_id": 0,
    "vocab_size": 32,
}

# same conv kernel/stride pattern (6480 samples -> 20 frames), small widths
TINY_OVERRIDES: dict = {
    "conv_dim": [16, 16, 16, 16, 16, 16, 16],
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
}


def random_config(full: dict, tiny: bool) -> dict:
    """A random folder's config.json content: `full`, or its tiny widths, marked random."""
    return {**full, **(TINY_OVERRIDES if tiny else {}), RANDOM_MARK: True}


def hubert_config_dict(tiny: bool) -> dict:
    """The config.json content for the full (hubert-large-ls960-ft) or tiny random model."""
    return random_config(HUBERT_LARGE_CONFIG, tiny)


def legacy_name(key: str) -> str:
    """Name the positional conv's weight norm as the published checkpoint does (weight_g / weight_v)."""
    return (key.replace("parametrizations.weight.original0", "weight_g")
               .replace("parametrizations.weight.original1", "weight_v"))


def random_tensor(key: str, shape: tuple[int, ...], gen: torch.Generator, hidden: int) -> torch.Tensor:
    """One parameter: norms ~1, biases small, conv/linear weights scaled by 1/sqrt(fan_in)."""
    t = torch.randn(shape, generator=gen, dtype=torch.float32)
    if key.endswith("masked_spec_embed"):
        return torch.rand(shape, generator=gen, dtype=torch.float32)
    if "layer_norm" in key:
        return 1.0 + 0.1 * t if key.endswith("weight") else 0.05 * t
    if key.endswith("bias"):
        return 0.02 * t
    if key.endswith("weight_g"):  # [1, 1, K]: norm of each kernel tap's [hidden, hidden/groups] slice
        return math.sqrt(hidden / shape[-1]) * (1.0 + 0.1 * t)
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
    return t / math.sqrt(fan_in)


def write_random_folder(out_dir: Path, cfg_dict: dict, shapes: dict[str, tuple[int, ...]], gen_seed: int) -> None:
    """Fill `shapes` (the model's keys, in its own naming) with seeded random values under the published checkpoint's
    names and write them as model.safetensors, with `cfg_dict` as config.json, into `out_dir` (HuBERT's and the
    speech-emotion classifier's folders alike)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(gen_seed)
    hidden = int(cfg_dict["hidden_size"])
    state = {}
    for key in sorted(shapes):
        name = legacy_name(key)
        state[name] = random_tensor(name, shapes[key], gen, hidden).contiguous()
    tmp = out_dir / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    give_usual_mode(tmp)                    # safetensors writes 0600; the set's other files follow the umask
    tmp.replace(out_dir / "model.safetensors")
    cfg_out = dict(cfg_dict)
    cfg_out["transformers_version"] = __import__("transformers").__version__
    (out_dir / "config.json").write_text(json.dumps(cfg_out, indent=2, sort_keys=True) + "\n")


def write_random_hubert(out_dir: str | os.PathLike, tiny: bool, seed: int) -> Path:
    """Write config.json + model.safetensors (random HubertForCTC) into out_dir; returns out_dir."""
    from transformers import HubertConfig, HubertForCTC

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_dict = hubert_config_dict(tiny)
    config = HubertConfig(**{k: v for k, v in cfg_dict.items() if k not in ("model_type", RANDOM_MARK)})
    with torch.device("meta"):  # shapes only: no memory, no global RNG
        shapes = {k: tuple(v.shape) for k, v in HubertForCTC(config).state_dict().items()}
    write_random_folder(out_dir, cfg_dict, shapes, int(seed))
    (out_dir / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(CTC_VOCAB)}) + "\n")
    return out_dir
