#!/usr/bin/env bash
# Nightly batch: render every WAV in a folder with one avatar, checking exit codes.
#   scripts/nightly_example.sh AVATAR IN_DIR OUT_DIR [extra render options...]
# Exit status: 0 when every file rendered; 1 when some failed (listed at the end); 5/6 at once when
# the avatar or the checkpoints are unusable (no point trying the other files).
set -uo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 AVATAR IN_DIR OUT_DIR [render options...]" >&2
    exit 2
fi
avatar=$1; in_dir=$2; out_dir=$3; shift 3
DF="${DITTO_FAST:-ditto-fast}"
mkdir -p "$out_dir"
failed=()
shopt -s nullglob
for wav in "$in_dir"/*.wav; do
    out="$out_dir/$(basename "${wav%.*}").mp4"
    if [ -s "$out" ] && [ "$out" -nt "$wav" ]; then
        echo "skip  $out (up to date)"
        continue
    fi
    $DF render --avatar "$avatar" --audio "$wav" -o "$out" --quiet "$@"
    rc=$?
    case $rc in
        0)   echo "ok    $out" ;;
        3)   echo "bad input, skipped: $wav" >&2; failed+=("$wav") ;;
        5|6) echo "avatar or checkpoints unusable (exit $rc); stopping" >&2; exit $rc ;;
        130|143) echo "interrupted" >&2; exit $rc ;;
        *)   echo "failed (exit $rc): $wav" >&2; failed+=("$wav") ;;
    esac
done
if [ ${#failed[@]} -gt 0 ]; then
    printf 'failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
