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
judges the goals the checks measure (graphs vs eager, allocation vs plan).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

ON_CPU = not torch.cuda.is_available() and os.environ.get("OSTINATO_GPU_TESTS_ON_CPU") == "1"
if ON_CPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when Triton is first imported, later than this

import pytest  # noqa: E402

from ostinato.bench.gpu_setup import GpuSetup, make_setup  # noqa: E402

FIGURES: dict[str, float] = {}  # measured figures the checks record, printed in pytest's summary


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
