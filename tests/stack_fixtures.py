"""Make what CI's second stack tests against, on the first (pinned, mediapipe) stack: the suite's tiny
checkpoints and anchor, the anchor registered, and a reference render with this stack's versions.

    .venv/bin/python tests/stack_fixtures.py DIR      # then DITTO_FAST_STACK_FIXTURES=DIR on the second stack
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "support"))

REFERENCE_SPEECH = (1.0, 2.0)   # the reference render's audio: seconds start, length of the committed speech


def stack_versions() -> dict[str, str]:
    """The versions that differ between the two stacks."""
    import platform

    import cv2
    import numpy
    import torch
    import transformers

    return {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "opencv": cv2.__version__}


def reference_audio(path: Path) -> Path:
    """REFERENCE_SPEECH cut from tests/data/speech_en_16k.wav into `path`."""
    import soundfile as sf

    audio, sr = sf.read(REPO / "tests" / "data" / "speech_en_16k.wav", dtype="float32")
    start, length = REFERENCE_SPEECH
    sf.write(path, audio[int(start * sr):int((start + length) * sr)], sr)
    return path


def render_reference(out_dir: Path, checkpoints: Path) -> dict:
    """Render the reference clip with the avatar 'anchor' (fp32 on the CPU, seed 0); returns its profile summary."""
    from ditto_fast.engine.renderer import Renderer
    from ditto_fast.engine.request import RenderRequest

    out_dir.mkdir(parents=True, exist_ok=True)
    audio = reference_audio(out_dir / "speech.wav")
    result = Renderer(checkpoints, device="cpu", precision="fp32").render(
        RenderRequest("anchor", audio, out_dir / "reference.mp4", seed=0))
    return {"frames": result.timings["frames"], "mouth": [float(m) for m in result.mouth]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    os.environ["DITTO_FAST_CPU_PRECISION"] = "fp32"
    os.environ["DITTO_FAST_HOME"] = str(args.dir / "home")
    from ditto_fast.avatar.register import register_avatar
    from ditto_fast.checkpoints.random_weights import write_random
    from synthetic import write_test_anchor

    args.dir.mkdir(parents=True, exist_ok=True)
    ckpt = write_random(args.dir / "checkpoints", tiny=True, seed=0)
    anchor = write_test_anchor(args.dir / "anchor.mp4")
    register_avatar(anchor, name="anchor", checkpoints=ckpt, device="cpu", force=True)
    summary = render_reference(args.dir / "reference", ckpt)
    (args.dir / "stack.json").write_text(json.dumps({"versions": stack_versions(), "reference": summary}, indent=2))
    print(f"stack fixtures in {args.dir}: {stack_versions()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
