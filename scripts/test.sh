#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/setup/setup_env.sh"
# compiled modules and pytest's rewritten tests are cached in __pycache__ (ignored by git): with the cache off, as
# some hosts set it, every run and every engine process compiles them all again (about 6 s of the quick tier)
unset PYTHONDONTWRITEBYTECODE
exec "$REPO/.venv/bin/python" -m pytest "$@"
