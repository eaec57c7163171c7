#!/usr/bin/env bash
# Create .venv in the repo root if missing and install ditto-fast with everything (registration's mediapipe
# included) on the pinned stack (scripts/setup/stack-pinned.txt). Sourced by scripts/test.sh and scripts/demo.sh;
# safe to run again (skips work when up to date).
# The interpreter: $PYTHON, else the first of python3.12, python3.11, python3.10, python3 that runs and is
# 3.10-3.12 (mediapipe 0.10.21 has no wheel past 3.12); none: one line saying what to install, exit 2.
set -euo pipefail
here="${BASH_SOURCE[0]%/*}"; [ "$here" = "${BASH_SOURCE[0]}" ] && here=.
REPO="$(cd "$here/../.." && pwd)"
cd "$REPO"

source "$REPO/scripts/setup/python_pick.sh"     # _find_python, _py_in_range

if [ ! -x .venv/bin/python ]; then
    PY=$(_find_python) || exit 2
    echo "[setup] creating .venv with $("$PY" --version 2>&1)" >&2
    if ! "$PY" -m venv .venv >/dev/null 2>&1; then
        rm -rf .venv
        echo "[setup] $PY cannot create a virtual environment (no venv module); install it (e.g. apt-get install python$(_py_in_range "$PY")-venv) and run again" >&2
        exit 2
    fi
elif ! _py_in_range .venv/bin/python >/dev/null; then
    echo "[setup] .venv has $(.venv/bin/python --version 2>&1), outside 3.10-3.12; remove .venv and run again (PYTHON= picks the interpreter)" >&2
    exit 2
fi
VPY="$REPO/.venv/bin/python"
stamp=".venv/.ditto-fast-installed-$(cat pyproject.toml setup.py scripts/setup/stack-pinned.txt | sha256sum | cut -c1-16)"
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
# a .venv made on a CPU machine (or carried from one) has the CPU build: on a GPU machine it is replaced
if [ "$gpu" = 1 ] && "$VPY" -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)" 2>/dev/null; then
    echo "[setup] GPU found but .venv has the CPU build of torch: replacing it" >&2
    "$VPY" -m pip uninstall -q -y torch >&2
    rm -f "$stamp"
fi
if [ ! -f "$stamp" ]; then
    pins=(-c "$REPO/scripts/setup/stack-pinned.txt")
    "$VPY" -m pip install -q --upgrade pip >&2
    if ! "$VPY" -c "import torch" 2>/dev/null; then
        if [ "$gpu" = 1 ]; then
            echo "[setup] GPU found: installing torch with CUDA" >&2
            "$VPY" -m pip install -q "${pins[@]}" torch >&2
        else
            # no GPU: the CPU build (2.13.0 is provided as a local CPU wheel on our machines)
            echo "[setup] no GPU: installing the CPU build of torch" >&2
            "$VPY" -m pip install -q "torch==2.13.0" >&2
        fi
    fi
    "$VPY" -m pip install -q "${pins[@]}" "setuptools>=77" wheel "cython>=3.0,<4" numpy >&2
    "$VPY" -m pip install -q "${pins[@]}" --no-build-isolation -e ".[register,test,demo,captions]" >&2
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
