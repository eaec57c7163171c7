"""Locate the checkpoint directory, fingerprint its files, and write random checkpoints in the published layout."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import CheckpointError
from .hubert_random import write_random_hubert
from .models import NETWORK_NAMES, SPECS, build
from .models.loading import META_KEY

MODELS_SUBDIR = Path("ditto_pytorch") / "models"
HUBERT_DIRNAMES = ("hubert-large-ls960-ft", "hubert")
RANDOM_MARKER = "RANDOM_WEIGHTS.json"
GET_THEM = ("download the Ditto PyTorch release (ditto_pytorch/models/*.pth) and "
            "facebook/hubert-large-ls960-ft into it, or run `ditto-fast checkpoints init-random DIR`")


@dataclass
class CheckpointSet:
    """Paths of the six network files and the HuBERT directory under one checkpoint root."""

    root: Path
    files: dict[str, Path]
    hubert_dir: Path
    random_weights: bool = False
    _fingerprints: dict[str, str] = field(default_factory=dict, repr=False)

    def fingerprints(self) -> dict[str, str]:
        """Short content fingerprints of every network file and the HuBERT weights (cached)."""
        if not self._fingerprints:
            fp = {name: file_fingerprint(p) for name, p in self.files.items()}
            weights = sorted(self.hubert_dir.glob("*.safetensors")) + sorted(self.hubert_dir.glob("*.bin"))
            fp["hubert"] = file_fingerprint(weights[0]) if weights else "missing"
            self._fingerprints = fp
        return dict(self._fingerprints)

    def avatar_fingerprints(self) -> dict[str, str]:
        """Fingerprints of the networks an avatar cache depends on (registration side)."""
        fp = self.fingerprints()
        return {k: fp[k] for k in ("appearance_extractor", "motion_extractor")}


def file_fingerprint(path: Path, block: int = 1 << 20) -> str:
    """sha256 over size, first, middle and last MiB of a file: cheap, and changes with any re-export."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        for off in sorted({0, max(0, size // 2 - block // 2), max(0, size - block)}):
            f.seek(off)
            h.update(f.read(block))
    return h.hexdigest()[:16]


def resolve_root(explicit: str | os.PathLike | None = None) -> Path:
    """--checkpoints DIR, else $DITTO_FAST_CHECKPOINTS, else ./checkpoints."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("DITTO_FAST_CHECKPOINTS")
    return Path(env).expanduser() if env else Path("checkpoints")


def find_checkpoints(explicit: str | os.PathLike | None = None, need_hubert: bool = True,
                     networks: tuple[str, ...] = NETWORK_NAMES) -> CheckpointSet:
    """The checkpoint set under the resolved root (the given networks); CheckpointError naming what is
    missing and where to get it."""
    root = resolve_root(explicit)
    if not root.is_dir():
        raise CheckpointError(f"{root}: checkpoint directory not found; {GET_THEM}")
    files = {name: root / MODELS_SUBDIR / SPECS[name].filename for name in networks}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{missing[0]}: checkpoint file missing{more}; {GET_THEM}")
    hubert = next((root / d for d in HUBERT_DIRNAMES if (root / d).is_dir()), root / HUBERT_DIRNAMES[0])
    if need_hubert and not (hubert / "config.json").is_file():
        raise CheckpointError(f"{hubert}: HuBERT model directory missing (config.json not found); {GET_THEM}")
    marker = root / MODELS_SUBDIR / RANDOM_MARKER
    return CheckpointSet(root=root, files=files, hubert_dir=hubert, random_weights=marker.is_file())


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
                 networks: tuple[str, ...] = NETWORK_NAMES, hubert: bool = True) -> Path:
    """Write the six .pth files in the published layout and wrappings plus a HuBERT dir, random weights.

    `networks` / `hubert` select a subset (benchmarks); returns the checkpoint root.
    """
    root = Path(out_dir)
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
        torch.save(obj, tmp)
        os.replace(tmp, models_dir / s.filename)
    if hubert:
        write_random_hubert(root / HUBERT_DIRNAMES[0], tiny=tiny, seed=seed)
    (models_dir / RANDOM_MARKER).write_text(json.dumps(meta, indent=2) + "\n")
    return root
