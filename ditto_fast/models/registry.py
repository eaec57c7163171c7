"""Which module implements each network, how its checkpoint file wraps the state dict, its file name.

Every network module follows one small protocol:
  * a class whose ``__init__(**widths)`` defaults build the published full-size network;
  * ``widths_from_state_dict(sd) -> dict`` reads those widths back from checkpoint tensors
    (raises KeyError when a needed tensor is absent);
  * ``TINY_WIDTHS``: widths for the tiny test/CPU variant of the same architecture;
  * optionally a method ``fuse_for_inference()`` that folds spectral norm / eval BatchNorm in place.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch.nn as nn


@dataclass(frozen=True)
class NetSpec:
    name: str
    module: str          # python module under ditto_fast.models
    cls: str             # class name in that module
    wrapping: str        # "state_dict" | "dict:retarget_shoulder" | "dict:model_state_dict"
    filename: str        # file name in ditto_pytorch/models/
    title: str           # human name for messages


SPECS: dict[str, NetSpec] = {
    s.name: s
    for s in (
        NetSpec("appearance_extractor", "appearance", "AppearanceExtractor", "state_dict",
                "appearance_extractor.pth", "appearance feature extractor"),
        NetSpec("motion_extractor", "motion_extractor", "MotionExtractor", "state_dict",
                "motion_extractor.pth", "motion extractor"),
        NetSpec("warp_network", "warp", "WarpNetwork", "state_dict",
                "warp_network.pth", "warping network"),
        NetSpec("decoder", "decoder", "SPADEDecoder", "state_dict",
                "decoder.pth", "SPADE decoder"),
        NetSpec("stitch_network", "stitch", "StitchNetwork", "dict:retarget_shoulder",
                "stitch_network.pth", "stitching network"),
        NetSpec("lmdm", "lmdm", "LMDM", "dict:model_state_dict",
                "lmdm_v0.4_hubert.pth", "LMDM motion diffusion model"),
    )
}
NETWORK_NAMES: tuple[str, ...] = tuple(SPECS)


def spec(name: str) -> NetSpec:
    """The NetSpec for a network name; ValueError for an unknown one."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown network {name!r}; expected one of {', '.join(NETWORK_NAMES)}") from None


def module_of(name: str) -> Any:
    """The python module implementing network `name`."""
    return importlib.import_module(f"ditto_fast.models.{spec(name).module}")


def build(name: str, widths: dict | None = None, tiny: bool = False) -> nn.Module:
    """Construct network `name` (random init) at full size, tiny size, or the given widths."""
    mod = module_of(name)
    if widths is None:
        widths = dict(mod.TINY_WIDTHS) if tiny else {}
    return getattr(mod, spec(name).cls)(**widths)
