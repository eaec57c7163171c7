"""The seam figures of both blends on the five synthetic decoder faults (scripts/support/seam_faults.py), the flicker of the
seamless correction, and before/after crops of one fault as PNG (docs/images/seam_*.png)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from bench_common import REPO, save
from seam_faults import FAULTS, flicker, measure, own_crop, scene
from ditto_fast.render.putback import YuvPutback
from ditto_fast.media.yuv import I420, yuv_to_rgb_matrix


def _rgb(frame: np.ndarray) -> np.ndarray:
    """A yuv420p frame as RGB for a picture."""
    luma, chroma = I420.planes(frame)
    h, w = luma.shape[1:]
    uv = [cv2.resize(c, (w, h), interpolation=cv2.INTER_LINEAR) for c in chroma]
    return cv2.transform(cv2.merge([luma[0], *uv]), yuv_to_rgb_matrix("bt709"))


def pictures(out_dir: Path, fault: str = "brightness +8") -> list[Path]:
    """The plate, and the faulty crop pasted with each blend, cut round the face, as PNGs."""
    rgb, plate, M = scene()
    crop = FAULTS[fault](own_crop(rgb, M))
    x0, y0 = (M[:2, :2] @ np.array([-70.0, 0.0]) + M[:2, 2]).astype(int)
    x1, y1 = (M[:2, :2] @ np.array([582.0, 582.0]) + M[:2, 2]).astype(int)
    x0, y0 = max(x0, 0), max(y0, 0)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, frame in (("plate", plate), *((b, YuvPutback(blend=b)(plate.copy(), crop, M)) for b in
                                            ("feather", "seamless"))):
        path = out_dir / f"seam_{name}.png"
        big = cv2.resize(_rgb(frame)[y0:y1, x0:x1], None, fx=1.5, fy=1.5, interpolation=cv2.INTER_NEAREST)
        cv2.imwrite(str(path), cv2.cvtColor(big, cv2.COLOR_RGB2BGR))
        paths.append(path)
    return paths


def run(out_json: str | None, quick: bool = False) -> dict:
    """Print the table of seam figures per fault and blend; write the PNGs."""
    result = {"faults": {}, "pictures": [str(p.relative_to(REPO)) for p in pictures(REPO / "docs" / "images")]}
    print(f"{'fault':16} {'blend':9} {'ring':>6} {'step':>6} {'untouched':>9} {'detail':>6} {'flicker':>7}")
    for name, fault in FAULTS.items():
        for blend in ("feather", "seamless"):
            r = measure(blend, fault)
            if blend == "seamless":
                r["flicker"] = flicker(fault)
            result["faults"].setdefault(name, {})[blend] = r
            print(f"{name:16} {blend:9} {r['ring']:6.2f} {r['step']:6.2f} {100 * r['untouched']:8.1f}% "
                  f"{r['detail']:6.2f} {r.get('flicker', float('nan')):7.3f}")
    print("levels (8-bit): ring just outside the face, the worst of Y/U/V; step across the pasted edge less the\n"
          "plate's own; untouched: the crop square outside the face equal to the plate; detail: gradient error inside")
    return save(out_json, result)
