#!/usr/bin/env bash
# The main job on the built-in default: the tiny DeepSeek-V4 model, end to end, on this machine's CPU:
# make the checkpoint -> profile its routing on shipped agent sessions -> compile a plan for cpu-only
# -> replay an agent session with ostinato-run and print the per-turn table.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
out=${OSTINATO_DEMO_DIR:-build/demo}
sessions=plans/workloads/agent_turns.csv
mkdir -p "$out"

echo "== 1. a tiny random DeepSeek-V4 checkpoint in the official format (planted expert popularity)"
"$bin/ostinato-make-tiny" "$out/tiny" --preset tiny --seed 0 --popularity 1.0 --force --quiet
"$bin/ostinato-inspect" "$out/tiny" > "$out/inspect.txt"  # a file, not a pipe: `| head` may close it early
head -7 "$out/inspect.txt"

echo
echo "== 2. routing profiles: 8 coding sessions to plan from, 8 others held out (shapes shrunk to fit 2 cores)"
shrink=(--limit-turns 10 --scale 0.1 --max-generated 8 --quiet)
"$bin/ostinato-record" "$out/tiny" --sessions "$sessions" --limit-sessions 8 "${shrink[@]}" -o "$out/profile.safetensors"
"$bin/ostinato-record" "$out/tiny" --sessions "$sessions" --first-session 8 --limit-sessions 8 "${shrink[@]}" \
    -o "$out/holdout.safetensors"
"$bin/ostinato-profile" report "$out/profile.safetensors" --holdout "$out/holdout.safetensors" --budget-experts 4 \
    --plot "$out/coverage.png" | sed -n '5,16p'

echo
echo "== 3. the plan: hot experts resident on the (CPU-mapped) device, cold ones behind the generated CPU kernel"
"$bin/ostinato-compile" "$out/tiny" "$out/plan.yaml" --hardware cpu-only --profile "$out/profile.safetensors" \
    --context 8192 --max-hot-per-layer 4 --explain

echo
echo "== 4. replay a customer-service session (workload row 30) with ostinato-run"
"$bin/ostinato-run" "$out/plan.yaml" --device cpu --session "$sessions" --session-index 30 \
    --limit-turns 8 --scale 0.1 --max-generated 16
