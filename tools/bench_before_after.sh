#!/usr/bin/env bash
# The same CPU measurements on another revision and on this working tree, one after the other in one run:
# the demo's wait after tool outputs and decode tok/s (tools/demo.sh), torch ops per layer
# (bench/count_ops.py) and prompt/decode tok/s (bench/engine_speed.py) on the demo's plan.
#
#   bash tools/bench_before_after.sh REV [OUT_DIR] [CKPT]   (e.g. REV = main~3; OUT_DIR default build/before-after)
#
# CKPT (optional): also compile a cpu-only plan for that checkpoint on each side (context 4096, 4 hot
# experts per layer) and run bench/engine_speed.py on it, e.g. one made by
# `ostinato-make-tiny DIR --preset real-vocab` (the vocabulary llama.cpp's DSV4 support needs).
#
# REV is checked out into a worktree under OUT_DIR with a throwaway venv that reuses this checkout's
# .venv packages (its own editable install of REV, no downloads); the measuring tools are this tree's,
# copied into the worktree when REV lacks them. Prints one block per side; read the ratios, the machines
# here are shared and noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bash tools/bench_before_after.sh REV [OUT_DIR] [CKPT]}
out=$(realpath -m "${2:-build/before-after}")
ckpt=${3:+$(realpath "$3")}
here=$(pwd)
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$out" && mkdir -p "$out"
git worktree prune
git worktree add -q --detach "$out/before" "$rev"
trap 'git -C "$here" worktree remove --force "$out/before" 2>/dev/null || true' EXIT
python3 -m venv --without-pip "$out/before/.venv"
before_site=$("$out/before/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$before_site/base.pth"  # this checkout's packages (torch, triton, ...), not its editable install
(cd "$out/before" && .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1)
for tool in runtime/engine/op_count.py; do  # what bench/count_ops.py reads, when REV lacks it
    [ -e "$out/before/$tool" ] || cp "$tool" "$out/before/$tool"
done

measure() {  # $1: label, run inside the tree to measure
    echo "=== $1: $(git log --oneline -1 | cut -c1-100)"
    OSTINATO_DEMO_DIR="$out/demo-$1" bash tools/demo.sh > "$out/demo-$1.log" 2>&1
    grep -E "wait after tool output|decode: median" "$out/demo-$1.log"
    .venv/bin/python "$here/bench/count_ops.py" "$out/demo-$1/plan.yaml" | tail -1
    .venv/bin/python "$here/bench/engine_speed.py" "$out/demo-$1/plan.yaml" | tail -1
    if .venv/bin/ostinato-compile --help | grep -q -- --prefill-buckets; then
        # the same demo plan with bucket steps forced on (a cpu-only plan keeps none: both run eagerly)
        .venv/bin/ostinato-compile "$out/demo-$1/tiny" "$out/demo-$1/buckets.yaml" --hardware cpu-only \
            --profile "$out/demo-$1/profile.safetensors" --context 8192 --max-hot-per-layer 4 \
            --prefill-buckets 2,4,8,16,32,64 --kernel-dir "$out/demo-$1/kernels" > /dev/null
        .venv/bin/ostinato-run "$out/demo-$1/buckets.yaml" --device cpu --session plans/workloads/agent_turns.csv \
            --session-index 30 --limit-turns 8 --scale 0.1 --max-generated 16 2>/dev/null \
            | grep -E "wait after tool output|decode: median" | sed 's/^/buckets 2..64: /'
    fi
    if [ -n "$ckpt" ]; then
        .venv/bin/ostinato-compile "$ckpt" "$out/ckpt-$1/plan.yaml" --hardware cpu-only --context 4096 \
            --max-hot-per-layer 4 --kernel-dir "$out/ckpt-$1/kernels" > /dev/null
        echo "$(basename "$ckpt"): $(.venv/bin/python "$here/bench/engine_speed.py" "$out/ckpt-$1/plan.yaml" | tail -1)"
    fi
}
(cd "$out/before" && measure before)
measure after
