#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite, on a pytest-xdist worker per CPU (scripts/setup/test_workers.sh;
# -n 0 or DITTO_FAST_TEST_WORKERS=0 for one process). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/setup/setup_env.sh"
source "$REPO/scripts/setup/test_workers.sh"
# compiled modules and pytest's rewritten tests are cached in __pycache__ (ignored by git): with the cache off, as
# some hosts set it, every run and every engine process compiles them all again (about 6 s of the quick tier)
unset PYTHONDONTWRITEBYTECODE
exec "$REPO/.venv/bin/python" -m pytest ${WORKERS[@]+"${WORKERS[@]}"} "$@"
