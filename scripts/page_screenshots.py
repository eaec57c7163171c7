#!/usr/bin/env python
"""The newsroom page's screenshots in docs/images/ (newsroom_running.png: the form and a job rendering;
newsroom_page.png: the whole page with done jobs and their previews): runs the browser test
(tests/test_serve_page_browser.py: a real `serve`, tiny random networks, headless Debian chromium) with
DITTO_FAST_SCREENSHOTS pointing there.

    python scripts/page_screenshots.py [--out docs/images]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images", help="where the PNGs go")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DITTO_FAST_SCREENSHOTS": str(args.out.resolve())}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_serve_page_browser.py"], cwd=REPO, env=env)
    if done.returncode == 0:
        for name in ("newsroom_running.png", "newsroom_page.png"):
            shot = args.out / name
            print(f"{shot}: {'written' if shot.exists() else 'MISSING'}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
