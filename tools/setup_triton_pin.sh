#!/usr/bin/env bash
# Make build/triton-3.6: a virtual environment with only triton==3.6.0, the Triton of the team's GPU
# machine, so tests/test_triton_targets.py also compiles the generated kernels with it (compiling for
# an explicit GPU target needs neither torch nor a GPU). Safe to re-run: a venv that already has
# that version is kept. pip's output goes to build/triton-3.6/install.log, shown only when something fails.
set -euo pipefail
cd "$(dirname "$0")/.."
version=3.6.0
venv=build/triton-${version%.*}
python=${PYTHON:-python3}
if ! "$venv/bin/python" -c "import triton, sys; sys.exit(triton.__version__ != '$version')" 2>/dev/null; then
    mkdir -p build
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    log=$venv/install.log
    : >"$log"
    echo "setup: installing triton==$version into $venv (the GPU machine's Triton, for the compile test)"
    "$venv/bin/python" -m pip install "triton==$version" >>"$log" 2>&1 \
        || { cat "$log"; echo "setup failed: pip install triton==$version into $venv" >&2; exit 1; }
fi
echo "setup: $venv ready (triton $version)"
