#!/usr/bin/env bash
# The whole pipeline end to end on a fresh clone: set up .venv, write random checkpoints, build a
# synthetic 1080p anchor video, register it, render the committed speech file, print the stage table.
set -euo pipefail
source "$(dirname "$0")/setup/setup_env.sh"
PY="$REPO/.venv/bin/python"
OUT="${DEMO_OUT:-$REPO/demo_out}"
mkdir -p "$OUT"
export DITTO_FAST_HOME="$OUT/home"

if "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    SIZE=full; TINY=""; DEVICE=cuda
else
    SIZE=tiny; TINY="--tiny"; DEVICE=cpu
fi
CKPT="$OUT/checkpoints-$SIZE"
if [ ! -f "$CKPT/ditto_pytorch/models/RANDOM_WEIGHTS.json" ]; then
    echo "[demo] writing $SIZE random checkpoints to $CKPT"
    "$PY" -m ditto_fast.cli checkpoints init-random "$CKPT" $TINY --seed 0
fi

echo "[demo] building a synthetic 1920x1080 anchor video from skimage.data.astronaut()"
"$PY" "$REPO/scripts/support/make_anchor.py" "$OUT/anchor.mp4" --seconds 4

echo "[demo] registering the anchor"
"$PY" -m ditto_fast.cli register "$OUT/anchor.mp4" --name demo_anchor --force --checkpoints "$CKPT" --device "$DEVICE"

echo "[demo] avatar preview"
"$PY" -m ditto_fast.cli avatars show demo_anchor --preview "$OUT/avatar_preview.png" > /dev/null

echo "[demo] rendering $REPO/tests/data/speech_en_16k.wav"
"$PY" -m ditto_fast.cli render --avatar demo_anchor --audio "$REPO/tests/data/speech_en_16k.wav" \
    -o "$OUT/demo.mp4" --checkpoints "$CKPT" --device "$DEVICE" --timings "$OUT/demo_timings.json" \
    --preview "$OUT/demo_preview.png"

echo "[demo] output: $OUT/demo.mp4 (stage timings: $OUT/demo_timings.json)"
echo "[demo] previews: $OUT/avatar_preview.png (the avatar), $OUT/demo_preview.png (the render)"
if [ "$SIZE" = tiny ]; then
    echo "[demo] note: tiny RANDOM weights — the face region is noise; everything around it is the real pipeline"
fi
