#!/usr/bin/env bash
# Create .venv-current (CI's second stack: scripts/setup/stack-current.txt, no mediapipe) if missing and install it;
# safe to run again (skips work when up to date). --deps-only: the stack's packages without ditto-fast itself, which
# .ci/run runs beside setup_env.sh (both installs are CPU-bound, one core each); the editable install, whose build
# of the Cython kernel writes into the checkout as setup_env.sh's does, comes after, from test_current_stack.sh.
set -euo pipefail
here="${BASH_SOURCE[0]%/*}"; [ "$here" = "${BASH_SOURCE[0]}" ] && here=.
REPO="$(cd "$here/../.." && pwd)"
cd "$REPO"
source "$REPO/scripts/setup/python_pick.sh"
CUR="$REPO/.venv-current"
if [ ! -x "$CUR/bin/python" ]; then
    if [ -x .venv/bin/python ]; then             # the first stack's interpreter, as it was made with
        base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
    else
        base=$(_find_python) || exit 2
    fi
    echo "[stack] creating .venv-current with $("$base" --version 2>&1)" >&2
    "$base" -m venv "$CUR"
fi
deps="$CUR/.ditto-fast-current-deps-$(sha256sum < scripts/setup/stack-current.txt | cut -c1-16)"
if [ ! -f "$deps" ]; then
    echo "[stack] installing the current stack (scripts/setup/stack-current.txt)" >&2
    "$CUR/bin/python" -m pip install -q -r scripts/setup/stack-current.txt >&2
    rm -f "$CUR"/.ditto-fast-current-*
    touch "$deps"
fi
[ "${1:-}" = "--deps-only" ] && exit 0
stamp="$CUR/.ditto-fast-current-$(cat pyproject.toml scripts/setup/stack-current.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    "$CUR/bin/python" -m pip install -q --no-deps --no-build-isolation -e . >&2   # the OpenCV build above stays
    touch "$stamp"
fi
