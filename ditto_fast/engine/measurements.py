"""Verdicts of one-off machine probes (the CUDA batch size), kept as JSON in the store's probes/."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ditto_fast.core.home import store_root
from ditto_fast.render.fused import FusedRenderer


def remembered(name: str, key: list[Any], run: Callable[[], dict], valid: Callable[[dict], bool],
               root: str | os.PathLike | None = None) -> dict:
    """The verdict kept under probes/ for `name` and `key`, or `run()`'s, kept for next time (an unwritable
    store, or a damaged or invalid verdict, just means probing again)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(root or store_root()) / "probes" / f"{name}-{digest}.json"
    try:
        verdict = json.loads(path.read_text())
        if valid(verdict):
            return verdict
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    verdict = run()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(verdict, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass
    return verdict


def sample_inputs(fused: FusedRenderer, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fixed (f_s, x_s, x_d) batch shaped for `fused`'s warp network: what the probes time."""
    c = fused.warp.dense_motion_network.compress.in_channels         # the source features' shape
    d = fused.warp.third.conv.in_channels // c
    rng = np.random.default_rng(0)
    f_s = rng.standard_normal((batch, c, d, 64, 64)).astype(np.float16)
    x_s = rng.uniform(-0.5, 0.5, (batch, 21, 3)).astype(np.float32)
    x_d = x_s + rng.normal(0, 0.02, (batch, 21, 3)).astype(np.float32)
    return f_s, x_s, x_d
