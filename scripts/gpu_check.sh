#!/usr/bin/env bash
# The prepared GPU check, in one command on a bare GPU machine: the machine's own Python and torch (no
# registry, ffmpeg or mediapipe needed), run from the bundle that scripts/gpu/gpu_bundle.py builds on a set-up
# machine (it carries the project, an xz'd ffmpeg, small packages and the avatars). Arguments go to
# scripts/gpu/gpu_check.py (--device cpu --tiny: the dry run). PYTHON= picks the interpreter (default python3).
set -euo pipefail
here="${BASH_SOURCE[0]%/*}"; [ "$here" = "${BASH_SOURCE[0]}" ] && here=.
ROOT="$(cd "$here/.." && pwd)"
if [ ! -f "$ROOT/bundle/manifest.json" ]; then
    echo "gpu_check: $ROOT/bundle/manifest.json not found: this is not a GPU bundle; build one with .venv/bin/python scripts/gpu/gpu_bundle.py (writes gpu_bundle/) and run gpu_bundle/scripts/gpu_check.sh" >&2
    exit 2
fi
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 10) else 1)' 2>/dev/null; then
    echo "gpu_check: $PY is not a Python 3.10 or newer; set PYTHON= to the machine's Python with torch" >&2
    exit 2
fi
exec "$PY" "$ROOT/scripts/gpu/gpu_check.py" "$@"
