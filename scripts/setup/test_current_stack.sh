#!/usr/bin/env bash
# CI's second stack: .venv-current from scripts/setup/stack-current.txt (numpy 2, transformers 5, OpenCV 5, the
# newest CPU torch here; no mediapipe), then the render-side tests (-m "not slow and not register", and the
# cross-stack bounds of tests/test_project_stacks.py) against the avatar and reference render the first stack makes
# (tests/stack_fixtures.py; .venv is set up first if missing). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"          # the first stack: .venv, which registers the fixtures' avatar
cd "$REPO"
"$REPO/scripts/setup/setup_current.sh"
CUR="$REPO/.venv-current"
if "$CUR/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('mediapipe') is None)"; then
    echo "[stack] .venv-current has mediapipe; the second stack must not: remove .venv-current" >&2
    exit 2
fi
"$CUR/bin/python" -c "import numpy, torch, transformers, cv2; print(f'[stack] numpy {numpy.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, opencv {cv2.__version__}, no mediapipe')" >&2
FIX="${DITTO_FAST_STACK_FIXTURES:-$REPO/.stack-fixtures}"
echo "[stack] the first stack's fixtures in $FIX" >&2
"$REPO/.venv/bin/python" tests/stack_fixtures.py "$FIX" >&2
export DITTO_FAST_STACK_FIXTURES="$FIX"
source "$REPO/scripts/setup/test_workers.sh"
exec "$CUR/bin/python" -m pytest ${WORKERS[@]+"${WORKERS[@]}"} -m "not slow and not register" "$@"
