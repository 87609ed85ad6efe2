#!/usr/bin/env bash
# Set up a fresh clone: a virtual environment in .venv with PyTorch and Ostinato (editable, with the
# test extras). Safe to re-run: what is already installed is kept. pip's output goes to
# .venv/install.log and is shown only when something fails.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
log=.venv/install.log
run() { "$@" >>"$log" 2>&1 || { cat "$log"; echo "setup failed: $*" >&2; exit 1; }; }
: >"$log"
run .venv/bin/python -m pip install --upgrade pip
# Users with GPUs install the PyTorch build they need first; otherwise take the pinned CPU build.
.venv/bin/python -c "import torch" 2>/dev/null || run .venv/bin/python -m pip install torch==2.13.0
run .venv/bin/python -m pip install -e '.[test]'
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
