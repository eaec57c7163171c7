"""Read a published checkpoint file, check it against the network it claims to be, build and load it."""

from __future__ import annotations

import os
import pickle
import re
import warnings
import zipfile
from pathlib import Path

import torch
import torch.nn as nn

from ditto_fast.core.errors import CheckpointError
from ditto_fast.models.registry import SPECS, build, module_of, spec

# tensors whose presence identifies each network's file (used to say "this looks like X")
_SIGNATURES = {
    "appearance_extractor": "resblocks_3d.3dr0.conv1.weight",
    "motion_extractor": "detector.fc_exp.weight",
    "warp_network": "dense_motion_network.mask.weight",
    "decoder": "G_middle_0.conv_0.weight_orig",
    "stitch_network": "mlp.0.weight",
    "lmdm": "seqTransDecoder.stack.0.self_attn.in_proj_weight",
}


def _guess_network(sd: dict) -> str | None:
    for name, key in _SIGNATURES.items():
        if key in sd:
            return name
    return None


META_KEY = "ditto_fast"   # random checkpoints record {"random_weights": True, ...} here


def file_metadata(obj: object) -> dict:
    """ditto-fast metadata stored in a checkpoint object (empty for published weights)."""
    if isinstance(obj, dict) and isinstance(obj.get(META_KEY), dict):
        return dict(obj[META_KEY])
    root = getattr(obj, "_metadata", None) or {}
    entry = root.get("", {}) if isinstance(root, dict) else {}
    return dict(entry.get(META_KEY, {})) if isinstance(entry.get(META_KEY), dict) else {}


def unwrap(obj: object, wrapping: str, path: Path, title: str) -> dict[str, torch.Tensor]:
    """The state dict inside a loaded checkpoint object, per the file's wrapping."""
    if wrapping.startswith("dict:"):
        inner_key = wrapping.split(":", 1)[1]
        if isinstance(obj, dict) and inner_key in obj and isinstance(obj[inner_key], dict):
            obj = obj[inner_key]
        elif isinstance(obj, dict) and any(isinstance(v, torch.Tensor) for v in obj.values()):
            pass  # a bare state dict is accepted too
        else:
            raise CheckpointError(
                f"{path}: not a {title} checkpoint (expected a dict with key {inner_key!r}); "
                "use the file from the Ditto release or `ditto-fast checkpoints init-random`")
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{path}: holds no state dict for the {title}; re-download the file")
    sd = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            continue
        sd[k[len("module."):] if k.startswith("module.") else k] = v
    if not sd:
        raise CheckpointError(f"{path}: holds no tensors for the {title}; re-download the file")
    return sd


def _unreadable(p: Path, title: str, e: BaseException) -> CheckpointError:
    """The error for a checkpoint torch.load refused: one whole sentence, never a cut-off torch message."""
    text = str(e)
    if "Weights only load failed" in text:      # the pickle asks for code (a global or a call), not just tensors
        what = re.search(r"GLOBAL ([\w.]+)", text)
        named = f" (it asks for {what.group(1)})" if what else ""
        return CheckpointError(f"{p}: not a plain weights file; refused to load it{named}; use the {title} "
                               "file from the Ditto release")
    first = (text.strip().splitlines() or [type(e).__name__])[0]
    first = first if len(first) <= 160 else first[:157].rsplit(" ", 1)[0] + "..."
    return CheckpointError(f"{p}: cannot read the {title} checkpoint (truncated or corrupt: {first}); "
                           "re-download it")


def read_state_dict(name: str, path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a checkpoint file (weights_only) and return its unwrapped state dict, with clear errors."""
    return read_checkpoint(name, path)[0]


def read_checkpoint(name: str, path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, ditto-fast metadata) of a checkpoint file, loaded weights_only with clear errors."""
    s = spec(name)
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: {s.title} checkpoint not found; pass --checkpoints DIR "
                              "or run `ditto-fast checkpoints init-random DIR`")
    if p.is_dir():
        raise CheckpointError(f"{p}: is a directory, expected the {s.title} checkpoint file {s.filename}")
    if p.stat().st_size == 0:
        raise CheckpointError(f"{p}: empty file, expected the {s.title} checkpoint; re-download it")
    try:
        with warnings.catch_warnings():          # torch's pickle-protocol warnings: the error below says it
            warnings.simplefilter("ignore")
            obj = torch.load(p, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError,
            OSError, AttributeError, KeyError, IndexError) as e:
        raise _unreadable(p, s.title, e) from None
    return unwrap(obj, s.wrapping, p, s.title), file_metadata(obj)


def _mismatches(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> list[str]:
    out = []
    for k, v in expected.items():
        if k not in got:
            out.append(f"missing {k}")
        elif tuple(got[k].shape) != tuple(v.shape):
            out.append(f"{k} has shape {list(got[k].shape)}, expected {list(v.shape)}")
    out += [f"unexpected {k}" for k in got if k not in expected]
    return out


def _finite(v: torch.Tensor) -> bool:
    """Whether a tensor holds no NaN or infinity: one sum (NaN and inf propagate), and an exact look only
    when that sum is not finite (it may also overflow); a tenth of an element-wise check's time."""
    if not v.is_floating_point() or bool(torch.isfinite(v.sum())):
        return True
    return bool(torch.isfinite(v).all())


def check_state_dict(name: str, sd: dict[str, torch.Tensor], path: str | os.PathLike = "<memory>") -> nn.Module:
    """Build network `name` with widths read from `sd`, verify every key and shape; return the module."""
    s = spec(name)
    guess = _guess_network(sd)
    if guess is not None and guess != name:
        raise CheckpointError(f"{path}: this is a {SPECS[guess].title} checkpoint, not the {s.title}; "
                              f"give {s.filename} for the {s.title}")
    try:
        widths = module_of(name).widths_from_state_dict(sd)
        with torch.device("meta"):         # shapes only: the checkpoint's tensors replace them below
            net = build(name, widths)
    except (KeyError, IndexError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a {s.title} checkpoint (cannot read its widths: {e}); "
                              f"give {s.filename} from the Ditto release") from None
    bad = _mismatches(net.state_dict(), sd)
    broken = next((k for k, v in sd.items() if not _finite(v)), None)
    if broken is not None and not bad:
        raise CheckpointError(f"{path}: {broken} holds NaN or infinite values; re-download the {s.title} "
                              f"checkpoint {s.filename}")
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise CheckpointError(f"{path}: does not match the {s.title}: {shown}; "
                              f"give {s.filename} from the Ditto release")
    net.load_state_dict(sd, strict=True, assign=True)
    net.float()                           # as built: float32 whatever the file stores
    if _has_meta_tensors(net):            # a tensor made at construction that the checkpoint does not hold
        net = build(name, widths)
        net.load_state_dict(sd, strict=True)
    return net


def _has_meta_tensors(net: nn.Module) -> bool:
    """Whether any parameter, buffer or tensor attribute of `net` is still a shape without data."""
    for m in net.modules():
        tensors = [*m.parameters(recurse=False), *m.buffers(recurse=False),
                   *(v for v in vars(m).values() if isinstance(v, torch.Tensor))]
        if any(t.is_meta for t in tensors):
            return True
    return False


def is_random(*nets: nn.Module) -> bool:
    """Whether any of these loaded networks came from an init-random file (its metadata says so)."""
    return any(getattr(m, "ditto_meta", {}).get("random_weights") for m in nets)


def load(name: str, path: str | os.PathLike, device: str | torch.device = "cpu",
         dtype: torch.dtype = torch.float32, fuse: bool = True) -> nn.Module:
    """Network `name` from checkpoint `path`, in eval mode, on `device` in `dtype`, folded for inference."""
    sd, meta = read_checkpoint(name, path)
    net = check_state_dict(name, sd, path)
    net.eval()
    net.ditto_meta = meta          # e.g. {"random_weights": True} for init-random files
    if fuse and hasattr(net, "fuse_for_inference"):
        net.fuse_for_inference()
    net.to(device=device, dtype=dtype)
    for p in net.parameters():
        p.requires_grad_(False)
    return net
