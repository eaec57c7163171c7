#!/usr/bin/env bash
# Nightly batch: render every audio file in a folder with one avatar, in one process (models load once).
#   scripts/nightly_example.sh AVATAR IN_DIR OUT_DIR [extra batch options, e.g. --ray local]
# A rerun after a crash resumes: outputs already made from the same inputs are skipped.
# Exit status: 0 when every job is done or skipped; 7 when some failed (see OUT_DIR/report.json);
# 5/6 when the avatar or the checkpoints are unusable; 130/143 when interrupted; 2 when no ditto-fast is found.
# ditto-fast: $DITTO_FAST if set, else the one on PATH, else this checkout's .venv (made by scripts/test.sh or
# scripts/demo.sh), so cron, whose PATH holds no virtual environment, finds it.
set -uo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 AVATAR IN_DIR OUT_DIR [batch options...]" >&2
    exit 2
fi
avatar=$1; in_dir=$2; out_dir=$3; shift 3
REPO="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${DITTO_FAST:-}" ]; then
    DF=$DITTO_FAST
elif command -v ditto-fast >/dev/null 2>&1; then
    DF=ditto-fast
elif [ -x "$REPO/.venv/bin/ditto-fast" ]; then
    DF="$REPO/.venv/bin/ditto-fast"
else
    echo "$0: ditto-fast is neither on PATH nor in $REPO/.venv; run scripts/setup/setup_env.sh (or" \
         "./scripts/test.sh --co -q) once, or set DITTO_FAST=/path/to/ditto-fast" >&2
    exit 2
fi
mkdir -p "$out_dir"
$DF batch --avatar "$avatar" --audio-dir "$in_dir" --out-dir "$out_dir" --report "$out_dir/report.json" "$@"
rc=$?
case $rc in
    0)   echo "all clips rendered: $out_dir" ;;
    7)   echo "some clips failed; their errors are in $out_dir/report.json" >&2 ;;
    5|6) echo "avatar or checkpoints unusable (exit $rc)" >&2 ;;
    130|143) echo "interrupted; run again to resume" >&2 ;;
    *)   echo "batch failed (exit $rc)" >&2 ;;
esac
exit $rc
