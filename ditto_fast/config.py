"""Typed defaults for every stage; `configs/default.yaml` (or a user YAML) overrides them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError

DEFAULT_YAML = Path(__file__).resolve().parent / "configs" / "default.yaml"


@dataclass
class RegisterConfig:
    max_size: int = 1920          # long side of decoded frames
    batch_size: int = 8           # crops per extractor batch
    crop_scale: float = 2.3       # crop side / face box side
    crop_vx: float = 0.0          # crop centre shift, fractions of the box side
    crop_vy: float = -0.125
    crop_smooth_window: int = 13  # frames, centred smoothing of crop parameters (video)
    info_smooth_window: int = 13  # frames, centred mean over x_s_info (video)
    min_face_px: int = 64


@dataclass
class MotionConfig:
    steps: int = 25               # DDIM steps
    guidance: float = 2.0         # classifier-free guidance weight
    window: int = 80              # LMDM window (frames)
    overlap: int = 10             # frames cross-faded between windows
    smooth_window: int = 3        # centred mean over the pose/scale/translation dims
    smooth_dims: int = 202


@dataclass
class RenderConfig:
    batch_size: int = 1           # frames per warp+decode micro-batch
    crf: int = 18
    preset: str = "veryfast"


@dataclass
class Config:
    register: RegisterConfig = field(default_factory=RegisterConfig)
    motion: MotionConfig = field(default_factory=MotionConfig)
    render: RenderConfig = field(default_factory=RenderConfig)


def _apply(obj: Any, data: dict, where: str) -> None:
    names = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in data.items():
        if key not in names:
            raise UsageError(f"{where}: unknown setting {key!r}; known: {', '.join(names)}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise UsageError(f"{where}: {key} must be a mapping")
            _apply(current, value, f"{where}:{key}")
        else:
            setattr(obj, key, value)


def load_config(path: str | Path | None = None) -> Config:
    """Defaults, overridden by the packaged default.yaml, then by `path` when given."""
    cfg = Config()
    for p in (DEFAULT_YAML, Path(path) if path else None):
        if p is None or not p.is_file():
            if p is not None and p != DEFAULT_YAML:
                raise UsageError(f"{p}: config file not found")
            continue
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise UsageError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise UsageError(f"{p}: expected a mapping of sections")
        _apply(cfg, data, str(p))
    return cfg
