#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "$0")/setup/setup_env.sh"
exec "$REPO/.venv/bin/python" -m pytest "$@"
