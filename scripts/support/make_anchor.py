#!/usr/bin/env python
"""Write a synthetic anchor video: skimage's astronaut in a 1920x1080 studio frame, gently moving.

    python scripts/support/make_anchor.py OUT.mp4 [--seconds 4] [--face-px 180]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from synthetic import Motion, write_anchor_video


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--face-px", type=float, default=180.0, help="face size across, in pixels")
    ap.add_argument("--size", default="1920x1080", help="WxH")
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    motion = Motion(center=(w * 0.5, h * 0.52), velocity=(0.4, -0.1), spin_deg=0.04)
    write_anchor_video(args.out, max(1, round(args.seconds * 25)), size=(w, h), face_px=args.face_px, motion=motion)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
