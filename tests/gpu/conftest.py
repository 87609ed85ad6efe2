"""The GPU checks: pass/fail properties of the CUDA paths, run where CUDA is (`pytest -m gpu tests/gpu`;
on the lent GPU machine through tools/gpu_check.sh, with the throughput report).

Without CUDA every test here is skipped, unless OSTINATO_GPU_TESTS_ON_CPU=1: then they run on the CPU at
the tiny model's shapes (Triton's interpreter, graphs as their eager twin), so a rare GPU run does not
find a broken check. The skip hook of tests/conftest.py skips `gpu` tests without CUDA whatever the
variable says; that CPU run leaves it out:
    OSTINATO_GPU_TESTS_ON_CPU=1 pytest --confcutdir tests/gpu -m gpu tests/gpu
OSTINATO_GPU_WORK names a folder for the tiny checkpoint and its plans that processes share (the device
script runs each file in its own process); else each process writes its own. OSTINATO_GPU_FIGURES names a
file the measured figures are appended to (one JSON object a line), from which gpu_report --figures
judges the goals the checks measure (graphs vs eager, allocation vs plan). OSTINATO_GPU_COVERAGE names a
folder where each process leaves which runtime modules it imported and which it ran code of (runtime_coverage;
the device script sums them up for the CPU twin).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import torch

ON_CPU = not torch.cuda.is_available() and os.environ.get("OSTINATO_GPU_TESTS_ON_CPU") == "1"
if ON_CPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when Triton is first imported, later than this

import pytest  # noqa: E402

import ostinato.runtime  # noqa: E402
from ostinato.bench.gpu_setup import GpuSetup, make_setup  # noqa: E402

if ON_CPU:  # Triton's interpreter without the set-up it repeats inside a kernel (tests/triton_interpreter.py)
    import triton_interpreter

    triton_interpreter.install()

FIGURES: dict[str, float] = {}  # measured figures the checks record, printed in pytest's summary
RUNTIME = str(Path(ostinato.runtime.__file__).resolve().parent)  # runtime/, as checked out
RAN: set[str] = set()  # the files of every Python function called since the session began (with a coverage folder)


def _record_calls() -> None:
    """Note the file of every function that starts, cheaply: with sys.monitoring (Python 3.12+, the GPU machine's)
    each code object reports once and is then switched off; before 3.12 a profile hook that only notes the
    file name of each call (a set add), Triton's interpreted kernels left out of it (_unhook_triton_launches)."""
    if monitoring := getattr(sys, "monitoring", None):
        tool = monitoring.PROFILER_ID

        def started(code, offset):
            RAN.add(code.co_filename)
            return monitoring.DISABLE

        try:
            monitoring.use_tool_id(tool, "ostinato-gpu-coverage")
        except ValueError:  # another profiler holds the id: no coverage from this process, the checks still run
            return
        monitoring.register_callback(tool, monitoring.events.PY_START, started)
        monitoring.set_events(tool, monitoring.events.PY_START)
        return

    def called(frame, event, arg):
        if event == "call":
            RAN.add(frame.f_code.co_filename)

    _unhook_triton_launches()
    threading.setprofile(called)
    sys.setprofile(called)


def _unhook_triton_launches() -> None:
    """Before 3.12 (the CPU twin): Triton's interpreter runs a kernel as a great many Python calls of its own, each
    of which would call the profile hook (the Triton-heavy check files ran 3-4x slower under it). A kernel launch
    notes the kernel's file, as its first call would, and runs unhooked; a device function it calls notes its own."""
    try:
        from triton.runtime.interpreter import GridExecutor, InterpretedFunction
    except ImportError:  # no Triton: nothing of it runs
        return
    launch, device_call = GridExecutor.__call__, InterpretedFunction.__call__

    def unhooked_launch(self, *args, **kwargs):
        RAN.add(self.fn.__code__.co_filename)
        hook = sys.getprofile()
        sys.setprofile(None)  # this thread's hook only
        try:
            return launch(self, *args, **kwargs)
        finally:
            sys.setprofile(hook)

    def noted_device_call(self, *args, **kwargs):
        RAN.add(self.fn.__code__.co_filename)
        return device_call(self, *args, **kwargs)

    GridExecutor.__call__, InterpretedFunction.__call__ = unhooked_launch, noted_device_call


def runtime_coverage() -> dict[str, list[str]]:
    """{'imported': the runtime/ modules loaded in this process, 'ran': those any function of ran}, as paths under
    runtime/ ('engine/adapter.py')."""
    def under_runtime(path: str | None) -> str | None:
        if not path:
            return None
        real = os.path.realpath(path)
        return os.path.relpath(real, RUNTIME) if real.startswith(RUNTIME + os.sep) else None

    imported = {p for m in list(sys.modules.values()) if (p := under_runtime(getattr(m, "__file__", None)))}
    ran = {p for f in RAN if (p := under_runtime(f))}
    return {"imported": sorted(imported), "ran": sorted(ran & imported)}


def pytest_sessionstart(session) -> None:
    if os.environ.get("OSTINATO_GPU_COVERAGE"):
        _record_calls()


@pytest.fixture(scope="session", autouse=True)
def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if ON_CPU:
        return torch.device("cpu")
    pytest.skip("no CUDA device (OSTINATO_GPU_TESTS_ON_CPU=1 runs these on the CPU)")


@pytest.fixture(scope="session")
def h200(device, tmp_path_factory) -> GpuSetup:
    """The tiny model compiled for one H200, and the expert shapes of the kernel checks."""
    work = os.environ.get("OSTINATO_GPU_WORK")
    return make_setup(device, Path(work) if work else tmp_path_factory.mktemp("gpu"))


@pytest.fixture
def figure():
    """figure(name, value): a measured figure for the summary line (a check's verdict hides its margin)."""
    return FIGURES.__setitem__


def pytest_terminal_summary(terminalreporter) -> None:
    if FIGURES:
        terminalreporter.write_line("gpu figures: " + " ".join(f"{k}={v:.3g}" for k, v in FIGURES.items()))
        if path := os.environ.get("OSTINATO_GPU_FIGURES"):
            with open(path, "a") as f:
                f.writelines(json.dumps({"figure": k, "value": v}) + "\n" for k, v in FIGURES.items())
    if folder := os.environ.get("OSTINATO_GPU_COVERAGE"):
        sys.setprofile(None)
        threading.setprofile(None)
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"checks-{os.getpid()}.json").write_text(json.dumps(runtime_coverage()))
