"""Random weights in the published layout, for `ditto-fast checkpoints init-random` (the demo and the tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ditto_fast.checkpoints import EMOTION_DIRNAME, HUBERT_DIRNAMES, MODELS_SUBDIR, RANDOM_MARKER
from ditto_fast.checkpoints.random_emotion import write_random_emotion
from ditto_fast.checkpoints.random_hubert import write_random_hubert
from ditto_fast.core.errors import InputError
from ditto_fast.models import NETWORK_NAMES, SPECS, build
from ditto_fast.models.loading import META_KEY


def _random_tensor(key: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A sensible random value for one state-dict entry (scaled normal weights, unit norms, zero biases)."""
    if not t.is_floating_point():
        return torch.zeros_like(t)
    if key.endswith("running_var"):
        return torch.ones_like(t)
    if key.endswith("running_mean") or key.endswith("bias") or key.endswith("beta"):
        return torch.zeros_like(t)
    if key.endswith("freqs"):
        return t.clone()                      # rotary frequencies are fixed buffers, not weights
    if t.ndim >= 2:
        fan_in = max(1, t[0].numel())
        return torch.randn(t.shape, generator=gen) / fan_in ** 0.5
    if key.endswith("weight") or key.endswith("gamma"):
        return torch.ones_like(t)
    return 0.02 * torch.randn(t.shape, generator=gen)


# Output heads scaled so random networks produce values in the ranges trained ones do (keypoints and
# expressions well inside the warp grid, small motion deltas); otherwise every random render would
# sample outside the feature volume and show a flat grey face that ignores the motion.
HEAD_SCALES = {
    "detector.fc_kp.weight": 0.12, "detector.fc_exp.weight": 0.02, "detector.fc_t.weight": 0.03,
    "detector.fc_scale.weight": 0.02, "final_layer.weight": 0.02, "mlp.6.weight": 0.01,
}
HEAD_BIASES = {"detector.fc_scale.bias": 1.0}


def random_state_dict(name: str, tiny: bool, seed: int) -> dict[str, torch.Tensor]:
    """A full or tiny random state dict for network `name`, deterministic in `seed`."""
    net = build(name, tiny=tiny)
    gen = torch.Generator().manual_seed(seed * 1000 + NETWORK_NAMES.index(name))
    sd = {k: _random_tensor(k, v, gen) for k, v in net.state_dict().items()}
    for k, scale in HEAD_SCALES.items():
        if k in sd:
            sd[k] = sd[k] * scale
    for k, value in HEAD_BIASES.items():
        if k in sd:
            sd[k] = torch.full_like(sd[k], value)
    for k in [k for k in sd if k.endswith("weight_orig")]:   # spectral norm: store true singular vectors
        w = sd[k].reshape(sd[k].shape[0], -1)
        u, _, vh = torch.linalg.svd(w, full_matrices=False)
        stem = k[: -len("_orig")]
        sd[stem + "_u"], sd[stem + "_v"] = u[:, 0].contiguous(), vh[0].contiguous()
    return sd


def write_random(out_dir: str | os.PathLike, tiny: bool = False, seed: int = 0,
                 networks: tuple[str, ...] = NETWORK_NAMES, hubert: bool = True, emotion: bool | None = None) -> Path:
    """Write the six .pth files in the published layout and wrappings plus a HuBERT dir and the speech-emotion
    classifier's dir, random weights.

    `networks` / `hubert` / `emotion` (default: as `hubert`) select a subset (benchmarks); returns the checkpoint root. InputError (exit 3) naming the
    folder when it cannot be written (under a file, a read-only disk, a full one).
    """
    root = Path(out_dir)
    try:
        _write_random(root, tiny, seed, networks, hubert, hubert if emotion is None else emotion)
    except OSError as e:
        raise _unwritable(root, e) from None
    return root


def _write_random(root: Path, tiny: bool, seed: int, networks: tuple[str, ...], hubert: bool, emotion: bool) -> None:
    models_dir = root / MODELS_SUBDIR
    models_dir.mkdir(parents=True, exist_ok=True)
    meta = {"random_weights": True, "tiny": tiny, "seed": seed, "writer": "ditto-fast checkpoints init-random"}
    for name in networks:
        s = SPECS[name]
        sd = random_state_dict(name, tiny, seed)
        if s.wrapping.startswith("dict:"):
            obj: object = {s.wrapping.split(":", 1)[1]: sd, META_KEY: meta}
        else:
            from collections import OrderedDict

            obj = OrderedDict(sd)
            obj._metadata = OrderedDict({"": {META_KEY: meta}})  # survives torch.load(weights_only=True)
        tmp = models_dir / (s.filename + ".tmp")
        try:
            torch.save(obj, tmp)
            os.replace(tmp, models_dir / s.filename)
        finally:
            tmp.unlink(missing_ok=True)
    if hubert:
        write_random_hubert(root / HUBERT_DIRNAMES[0], tiny=tiny, seed=seed)
    if emotion:
        write_random_emotion(root / EMOTION_DIRNAME, tiny=tiny, seed=seed)
    (models_dir / RANDOM_MARKER).write_text(json.dumps(meta, indent=2) + "\n")


def _unwritable(root: Path, e: OSError) -> InputError:
    """The one line for a checkpoint folder that cannot be written: a file in the way, or the disk's reason."""
    blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "" if blocker == root else f" {blocker}"
        return InputError(f"{root}:{where} is a file, not a folder; give a folder for the checkpoints")
    return InputError(f"{root}: cannot write the checkpoints there ({e.strerror or e}); give a folder on a writable "
                      "disk with space")
