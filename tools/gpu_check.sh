#!/usr/bin/env bash
# The device script (tools/gpu_check.py, which says what it runs): with the machine's own Python, PYTHON
# (default python3). On the lent GPU machine, with build/wheelhouse carried (docs/gpu.md gives the call):
#     bash tools/gpu_check.sh            # results in $OUT: summary.txt, report_table.txt, gpu_check.tar.gz
#     bash tools/gpu_check.sh --cpu      # the CPU twin, here
set -uo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" tools/gpu_check.py "$@"
