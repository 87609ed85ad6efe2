#!/usr/bin/env bash
# Set up a fresh clone: a virtual environment in .venv with PyTorch and Ostinato (editable, with the
# test extras). Safe to re-run: what is already installed is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Users with GPUs install the PyTorch build they need first; otherwise take the pinned CPU build.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]'
