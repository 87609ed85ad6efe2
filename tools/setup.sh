#!/usr/bin/env bash
# Set up a fresh clone: a virtual environment in .venv with PyTorch and Ostinato (editable). Safe to
# re-run: what is already installed is kept. pip's output goes to .venv/install.log and is shown only
# when something fails.
# - If ${PYTHON:-python3} already imports torch (a GPU machine's CUDA build), .venv reuses that
#   environment's packages and no torch is downloaded: Ostinato goes in without its dependencies, then
#   the runtime dependencies missing there come from build/wheelhouse (tools/gpu_wheelhouse.sh) when it
#   exists, offline (the team's GPU machine has no network), else from pip's index.
# - Otherwise (a CPU machine, CI): the pinned CPU build torch==2.13.0, Ostinato with its test extras,
#   and build/triton-3.6 (tools/setup_triton_pin.sh) for the compile test against the GPU machine's Triton.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
log=.venv/install.log
# What a step is doing, while it does it: its name, then every 15 s the latest thing pip is working on
# (the full output stays in $log, shown only when something fails), then how long it took.
say() { echo "setup: $*"; }
progress() {  # $1: pid of the step; a line only when pip has moved on, cut to 100 characters
    local now last=
    while kill -0 "$1" 2>/dev/null; do
        sleep 15
        kill -0 "$1" 2>/dev/null || break
        now=$(grep -E '^ *(Collecting|Downloading|Processing|Building|Installing)' "$log" | tail -n 1 | sed 's/^ *//')
        if [ -n "$now" ] && [ "$now" != "$last" ]; then say "  ... ${now:0:100}"; last=$now; fi
    done
}
run() {
    local start=$SECONDS
    "$@" >>"$log" 2>&1 &
    local pid=$!
    progress "$pid" &
    local ticker=$!
    wait "$pid" || { kill "$ticker" 2>/dev/null; cat "$log"; echo "setup failed: $*" >&2; exit 1; }
    kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
    say "  done in $((SECONDS - start)) s"
}

# .venv on top of the environment `python` runs in. A Python without ensurepip (uv-made environments,
# some distro builds) makes it without pip, and pip comes from the wheelhouse (a wheel runs as its own
# installer).
reuse_environment() {
    if ! "$python" -m venv --system-site-packages .venv 2>/dev/null; then
        rm -rf .venv
        "$python" -m venv --system-site-packages --without-pip .venv
        local pip_wheel=(build/wheelhouse/pip-*.whl)
        .venv/bin/python "${pip_wheel[0]}/pip" install --quiet --no-index "${pip_wheel[0]}"
    fi
}

# --system-site-packages reaches only the base interpreter's packages, so when `python` is itself in a
# venv (the GPU machine's is) a .pth file adds that venv's site folders, after .venv's own (what pip
# installs into .venv wins). Written on every run: cheap, and it repairs a .venv an earlier run left.
link_environment() {
    local line site
    line=$("$python" -c 'import site, sys
if sys.prefix != sys.base_prefix:
    print("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in site.getsitepackages()))')
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if [ -n "$line" ]; then echo "$line" >"$site/ostinato-base-env.pth"; fi
}

# With build/wheelhouse (a machine without network): pip without an index, from what `python`'s
# environment has and the wheelhouse. Without one, pip's index, for what the environment lacks.
pip_offline() {
    local source=()
    if [ -d build/wheelhouse ]; then source=(--no-index --find-links build/wheelhouse); fi
    .venv/bin/python -m pip install "${source[@]}" "$@" >>"$log" 2>&1 || {
        cat "$log"
        echo "setup failed: pip install $*: neither $python's environment nor build/wheelhouse has it;" \
             "make the wheelhouse with tools/gpu_wheelhouse.sh on a machine with network" >&2
        exit 1
    }
}

install_offline() {
    pip_offline 'setuptools>=77'  # pyproject's build backend
    pip_offline --no-deps --no-build-isolation -e .
    local deps
    mapfile -t deps < <(.venv/bin/python -c 'from importlib.metadata import requires
print("\n".join(r for r in requires("ostinato") if "extra ==" not in r))')
    pip_offline "${deps[@]}"
}

if "$python" -c "import torch" 2>/dev/null; then
    [ -x .venv/bin/python ] || reuse_environment
    link_environment
    : >"$log"
    say "installing Ostinato into .venv on top of $python's environment (output: $log)"
    install_offline
    from="$python's environment"
else
    [ -x .venv/bin/python ] || { say "making .venv with $("$python" --version)"; "$python" -m venv .venv; }
    : >"$log"
    say "upgrading pip in .venv (output: $log)"
    run .venv/bin/python -m pip install --upgrade pip
    # Users with GPUs may install the PyTorch build they need into .venv first; else the pinned CPU build.
    if ! .venv/bin/python -c "import torch" 2>/dev/null; then
        say "installing PyTorch (torch==2.13.0, the CPU build; about a minute)"
        run .venv/bin/python -m pip install torch==2.13.0
    fi
    say "installing Ostinato (editable) with its dependencies and test extras (about a minute)"
    run .venv/bin/python -m pip install -e '.[test]'
    from=.venv
fi
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)') from $from)"
if [ "$from" = .venv ]; then bash tools/setup_triton_pin.sh; fi
