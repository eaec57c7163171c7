#!/usr/bin/env bash
# The prepared GPU check (issue 13): from a fresh clone on a CUDA machine, set up .venv and run
# scripts/gpu_check.py (full-size fp16, 1080p, batch 1/4/8, look-ahead on/off, x264 vs NVENC).
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
exec "$REPO/.venv/bin/python" "$REPO/scripts/gpu_check.py" "$@"
