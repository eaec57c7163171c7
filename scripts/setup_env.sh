#!/usr/bin/env bash
# Create .venv in the repo root if missing and install ditto-fast with its test/demo extras.
# Sourced by scripts/test.sh and scripts/demo.sh; safe to run again (skips work when up to date).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($PY --version 2>&1)" >&2
    "$PY" -m venv .venv
fi
VPY="$REPO/.venv/bin/python"
stamp=".venv/.ditto-fast-installed-$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)"
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
# a .venv made on a CPU machine (or carried from one) has the CPU build: on a GPU machine it is replaced
if [ "$gpu" = 1 ] && "$VPY" -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)" 2>/dev/null; then
    echo "[setup] GPU found but .venv has the CPU build of torch: replacing it" >&2
    "$VPY" -m pip uninstall -q -y torch >&2
    rm -f "$stamp"
fi
if [ ! -f "$stamp" ]; then
    "$VPY" -m pip install -q --upgrade pip >&2
    if ! "$VPY" -c "import torch" 2>/dev/null; then
        if [ "$gpu" = 1 ]; then
            echo "[setup] GPU found: installing torch with CUDA" >&2
            "$VPY" -m pip install -q "torch>=2.4,<2.15" >&2
        else
            # no GPU: the CPU build (2.13.0 is provided as a local CPU wheel on our machines)
            echo "[setup] no GPU: installing the CPU build of torch" >&2
            "$VPY" -m pip install -q "torch==2.13.0" >&2
        fi
    fi
    "$VPY" -m pip install -q "setuptools>=77" wheel "cython>=3.0,<4" "numpy>=1.24,<2" >&2
    "$VPY" -m pip install -q --no-build-isolation -e ".[test,demo]" >&2
    rm -f .venv/.ditto-fast-installed-*
    touch "$stamp"
fi
# (re)build the Cython putback kernel in place when its source is newer than the built module
if [ -f ditto_fast/render/_blend.pyx ]; then
    so=$(ls ditto_fast/render/_blend*.so 2>/dev/null | head -n1 || true)
    if [ -z "$so" ] || [ ditto_fast/render/_blend.pyx -nt "$so" ]; then
        echo "[setup] building the Cython putback kernel" >&2
        "$VPY" setup.py -q build_ext --inplace >&2
    fi
fi
