#!/usr/bin/env bash
# The device script: what a lent GPU machine (one H200, no network, a few minutes) runs, as one command.
# With build/wheelhouse carried (tools/gpu_wheelhouse.sh makes it on a machine with network):
#     bash tools/gpu_check.sh
# 0. the pre-flight, tools/gpu_preflight.py (seconds, before setup): a C++ compiler that builds and loads
#    OpenMP code, a GPU with a driver, at least NEED_GIB (8) GiB of it free, and the wheelhouse when setup
#    needs it; one summary line per check;
# 1. tools/setup.sh: .venv on the machine's torch, the missing dependencies from the wheelhouse;
# 2. the GPU checks (pass/fail), `pytest -m gpu` over tests/gpu, one file (one concept) per process under
#    a time limit, so a failing, crashing or hanging check costs only its own file;
# 3. the throughput report, `python -m ostinato.bench.gpu_report`: each measurement in its own process
#    under a time limit (a sticky CUDA error costs only its own), its rows added to report_table.txt as
#    they finish; a table, a line of ratios and a line of the issue's goals (met or missed; those the
#    checks measure come from figures.jsonl, which they write).
# Every step runs whatever the ones before it did. Their output goes to the terminal and to $OUT (else
# build/gpu_check): preflight.log, setup.log, checks.log with junit/FILE.xml per check file, figures.jsonl,
# report.txt, report_table.txt, and summary.txt (one line per step and pre-flight check, and the goals).
# Exit status 1 when any step or pre-flight check failed, else 0.
# Time: the whole run stays within BUDGET_S (default 570 s: the device tool stops a command at 600); a
# check file gets at most CHECK_S (150 s), and no check file starts when fewer than REPORT_S (180 s)
# would be left for the report, which stops starting measurements 20 s before its own limit.
# SKIP_SETUP=1: a rerun on a machine this script already set up.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
case $out in /*) ;; *) out=$PWD/$out ;; esac  # absolute: the checks' processes find figures.jsonl by it
budget=${BUDGET_S:-570} check_s=${CHECK_S:-150} report_s=${REPORT_S:-180}
mkdir -p "$out/junit"
: >"$out/summary.txt"
: >"$out/preflight.log"
export OSTINATO_GPU_FIGURES=$out/figures.jsonl  # the checks append their figures, the report judges their goals
: >"$OSTINATO_GPU_FIGURES"
export OSTINATO_GPU_WORK PYTHONUNBUFFERED=1  # unbuffered: a step cut short still leaves its lines in the logs
OSTINATO_GPU_WORK=$(mktemp -d)  # the tiny checkpoint and its plan: the first check file writes them, the rest read
trap 'rm -rf "$OSTINATO_GPU_WORK"' EXIT
failed=0

# run NAME LIMIT LOG CMD...: CMD under LIMIT seconds, its output shown and appended to LOG; one summary line
run() {
    local name=$1 limit=$2 log=$3 start=$SECONDS rc verdict
    shift 3
    if [ "$limit" -le 0 ]; then
        verdict="NOT RUN (out of time)"
    else
        timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$log"
        rc=${PIPESTATUS[0]}
        case $rc in
            0) verdict=ok ;;
            124 | 137) verdict="TIMED OUT after ${limit} s" ;;
            *) verdict="FAILED (exit status $rc)" ;;
        esac
    fi
    [ "$verdict" = ok ] || failed=1
    printf '%-40s %-28s %4d s\n' "$name" "$verdict" $((SECONDS - start)) | tee -a "$out/summary.txt"
}

left() { echo $((budget - SECONDS - $1)); }  # seconds left, keeping $1 for what comes after
min() { echo $(($1 < $2 ? $1 : $2)); }

# the machine's Python (what setup builds .venv on), before setup; a failed check fails the run, the rest
# still runs: what it can show, with the pre-flight's lines saying why the rest broke
preflight=(--need-gib "${NEED_GIB:-8}")
[ "${SKIP_SETUP:-0}" = 1 ] || preflight+=(--setup)
run preflight 90 "$out/preflight.log" "${PYTHON:-python3}" tools/gpu_preflight.py "${preflight[@]}"
grep '^preflight: ' "$out/preflight.log" >>"$out/summary.txt"
if [ "${SKIP_SETUP:-0}" != 1 ]; then
    run setup "$(min 240 "$(left "$report_s")")" "$out/setup.log" bash tools/setup.sh
fi
python=.venv/bin/python
[ -x "$python" ] || python=python3  # setup failed before making .venv: the steps below say what is missing
# without CUDA every check skips with status 0 (the report fails, listing what it did not measure): say so here
run cuda 60 "$out/setup.log" "$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'
print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'CUDA', torch.version.cuda)"
for file in tests/gpu/test_*.py; do
    name=$(basename "$file" .py)
    run "$name" "$(min "$check_s" "$(left "$report_s")")" "$out/checks.log" \
        "$python" -m pytest -m gpu -q -p no:cacheprovider --junitxml="$out/junit/$name.xml" "$file"
done
report_limit=$(left 0)
run report "$report_limit" "$out/report.txt" "$python" -m ostinato.bench.gpu_report --work "$OSTINATO_GPU_WORK" \
    --table "$out/report_table.txt" --figures "$OSTINATO_GPU_FIGURES" --budget-s $((report_limit - 20))
grep '^goals: ' "$out/report.txt" | tail -n 1 >>"$out/summary.txt"
echo "gpu_check: results in $out"
cat "$out/summary.txt"
exit $failed
