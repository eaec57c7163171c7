"""The six Ditto networks as pure torch modules, and `load(name, path)` for published checkpoints."""

from __future__ import annotations

from ditto_fast.models.registry import NETWORK_NAMES, SPECS, NetSpec, build, spec
from ditto_fast.models.loading import is_random, load, read_state_dict

__all__ = ["NETWORK_NAMES", "SPECS", "NetSpec", "build", "spec", "is_random", "load", "read_state_dict"]
