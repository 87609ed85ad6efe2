#!/usr/bin/env bash
# The main job on the built-in default: the tiny DeepSeek-V4 model, end to end.
# Grows with the pipeline: make the checkpoint -> (profile -> compile -> run).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
out=${OSTINATO_DEMO_DIR:-build/demo}
mkdir -p "$out"

echo "== 1. a tiny random DeepSeek-V4 checkpoint in the official format (planted expert popularity)"
"$bin/ostinato-make-tiny" "$out/tiny" --preset tiny --seed 0 --popularity 1.0 --force --quiet
"$bin/ostinato-inspect" "$out/tiny"

echo
echo "== 2. the real DeepSeek-V4-Flash, sized from its config.json alone"
"$bin/ostinato-inspect" plans/models/deepseek-v4-flash | head -8
