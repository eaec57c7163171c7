"""A transformers model folder (config.json + model.safetensors or pytorch_model.bin) loaded as it was downloaded:
the folder checked, the encoder loaded through transformers, extra head tensors read as plain tensors. HuBERT
(audio/hubert.py) and the speech-emotion classifier (audio/emotion.py) share it; each names itself in the messages."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ditto_fast.core.errors import CheckpointError


@dataclass(frozen=True)
class FolderKind:
    """What a folder should hold, for the checks and their messages."""

    name: str               # "HuBERT", "speech-emotion"
    model_type: str         # config.json's model_type
    source: str             # where the real one comes from ("facebook/hubert-large-ls960-ft")
    missing_hint: str       # the fix when the folder is missing


def check_folder(model_dir: Path, kind: FolderKind) -> dict:
    """config.json of a model folder of `kind`, read; CheckpointError naming the folder or file and the fix."""
    if not model_dir.exists():
        raise CheckpointError(f"{model_dir}: {kind.name} model directory not found; {kind.missing_hint}")
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: is a file; give the {kind.name} model directory (config.json + weights)")
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{model_dir}: no config.json; give a transformers {kind.name} directory "
                              f"({kind.source} layout)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{cfg_path}: unreadable config ({exc.__class__.__name__}); "
                              f"re-download the {kind.name} directory") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") != kind.model_type:
        found = cfg.get("model_type") if isinstance(cfg, dict) else None
        raise CheckpointError(f"{cfg_path}: model_type is {found!r}, not {kind.model_type!r}; "
                              f"give the {kind.source} directory")
    if not any((model_dir / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        raise CheckpointError(f"{model_dir}: no model.safetensors or pytorch_model.bin; "
                              f"re-download the {kind.name} weights")
    return cfg


def load_encoder(model_cls: type, model_dir: str | os.PathLike, kind: FolderKind, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The folder's encoder as `model_cls` (a transformers PreTrainedModel: its head's keys are dropped), eval mode;
    CheckpointError for a folder that is missing, of another kind, unreadable or incomplete."""
    from transformers.utils import logging as hf_logging

    model_dir = Path(model_dir)
    check_folder(model_dir, kind)
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the dropped head is expected; report problems ourselves
    hf_logging.disable_progress_bar()  # transformers 5 draws a "Loading weights" bar on stderr
    try:
        model, info = model_cls.from_pretrained(model_dir, local_files_only=True,
                                                output_loading_info=True, dtype=torch.float32)
    except Exception as exc:  # corrupt/truncated weights, shape mismatch, bad config values
        if "Weights only load failed" in str(exc):      # the pickle asks for code, not just tensors
            raise CheckpointError(f"{model_dir}: pytorch_model.bin is not a plain weights file; refused to load it; "
                                  f"re-download the {kind.name} directory") from None
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise CheckpointError(f"{model_dir}: {kind.name} weights cannot be loaded ({msg[:160]}); "
                              f"re-download the {kind.name} directory") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing = [k for k in info.get("missing_keys", []) if k != "masked_spec_embed"]
    if missing or info.get("mismatched_keys"):
        what = missing[:3] or [k[0] if isinstance(k, tuple) else k for k in info["mismatched_keys"][:3]]
        raise CheckpointError(f"{model_dir}: {kind.name} weights are incomplete (missing e.g. {', '.join(what)}); "
                              f"re-download the {kind.name} directory")
    return model.to(device=device, dtype=dtype).eval()


def read_tensors(model_dir: str | os.PathLike, names: tuple[str, ...], kind: FolderKind,
                 head: str) -> dict[str, torch.Tensor] | None:
    """The named tensors (float32) of `head` (its name in messages) from the folder's weights (model.safetensors, or pytorch_model.bin read as plain
    tensors); None when any is absent, CheckpointError when the weights cannot be read."""
    model_dir = Path(model_dir)
    st_path, bin_path = model_dir / "model.safetensors", model_dir / "pytorch_model.bin"
    try:
        if st_path.is_file():
            from safetensors import safe_open

            with safe_open(str(st_path), framework="pt") as f:
                if all(n in f.keys() for n in names):
                    return {n: f.get_tensor(n).float() for n in names}
        elif bin_path.is_file():
            try:
                state = torch.load(bin_path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:        # a legacy (pre-zip) pickle cannot be memory-mapped: read it whole
                state = torch.load(bin_path, map_location="cpu", weights_only=True)
            if all(n in state for n in names):
                return {n: state[n].float() for n in names}
    except Exception as exc:            # unreadable weights: named, as load_encoder names them
        raise CheckpointError(f"{model_dir}: {head} cannot be read ({str(exc)[:120]}); "
                              f"re-download the {kind.name} directory") from None
    return None


def fuse_for_inference(model: torch.nn.Module) -> torch.nn.Module:
    """Fold a wav2vec2-family encoder's positional conv weight norm into a plain weight (same numbers, computed once)."""
    from torch.nn.utils import parametrize

    conv = model.encoder.pos_conv_embed.conv
    if parametrize.is_parametrized(conv, "weight"):
        with torch.no_grad():
            weight = conv.weight.detach().clone()  # g * v / ||v||, as every forward computes it
            parametrize.remove_parametrizations(conv, "weight", leave_parametrized=True)
            delattr(conv, "weight")
            conv.register_parameter("weight", torch.nn.Parameter(weight, requires_grad=False))
    elif hasattr(conv, "weight_g"):
        torch.nn.utils.remove_weight_norm(conv)
    return model
