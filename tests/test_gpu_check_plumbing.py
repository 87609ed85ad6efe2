"""The GPU run off the GPU. A GPU run is rare and short (tools/gpu_check.sh: the checks in tests/gpu, then
the throughput report bench/gpu_report.py), so everything up to the CUDA calls is run here:
- without CUDA the report names the figures that stay unverified and exits 0; with --cpu it runs every
  measurement on the CPU (the tiny model's shapes, Triton's interpreter, the decode graphs' eager twin)
  and its last line has every ratio the GPU run will report;
- without CUDA `pytest -m gpu tests/gpu` collects every check and skips it (no import fails), and with
  OSTINATO_GPU_TESTS_ON_CPU=1 the same checks run on the CPU and pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
GPU_TESTS = REPO / "tests" / "gpu"
RATIOS = ("decode_bw/peak", "prefill16/model", "h2d/link", "overlap", "hostnode/model", "eager/graph",
          "dynamic/graph16", "dynamic/graph64", "dynamic/graph120", "fp8_gemv_bw/peak", "fp8_gemm_flops/spec")
# what the checks record beside their verdicts (on the CPU: no CUDA allocator, so no alloc/plan_gpu0)
FIGURES = ("bf16_err/cpu_bf16", "greedy_agree", "held/plan_gpu0")
pytestmark = pytest.mark.slow  # subprocesses; the CPU runs take minutes (Triton's interpreter)
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real checks")


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=900, check=False,
                          cwd=REPO, env={**os.environ, **(env or {})})


def _report(*args: str) -> subprocess.CompletedProcess:
    return _run("-m", "ostinato.bench.gpu_report", *args)


def _gpu_checks(junit: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """pytest -m gpu over tests/gpu in a fresh process -> (the run, {test id: outcome} from its JUnit XML)."""
    r = _run("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *args,
             str(GPU_TESTS), env=env)
    outcomes = {}
    for case in ET.parse(junit).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("skipped", "failure", "error")]
        outcomes[f"{case.get('classname')}.{case.get('name')}"] = kinds[0] if kinds else "passed"
    return r, outcomes


def _files(outcomes: dict) -> set[str]:
    return {next(part for part in test_id.split(".") if part.startswith("test_")) for test_id in outcomes}


@no_cuda
def test_without_cuda_the_report_lists_what_stays_unverified():
    r = _report()
    assert r.returncode == 0, r.stderr
    assert "UNVERIFIED" in r.stdout
    for name in ("decode", "prefill", "upload", "hostnode", "step", "bucket", "fp8"):
        assert f"  {name} " in r.stdout
    assert _report("--only", "nope").returncode == 2


def test_cpu_mode_runs_every_measurement(tmp_path):
    r = _report("--cpu", "--work", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "FAILED" not in r.stdout and "raised" not in r.stdout, r.stdout
    assert lines[-2] == "gpu_report: 7 of 7 measurements ran", lines[-2]
    ratios = dict(item.split("=") for item in lines[-1].removeprefix("ratios: ").split())
    assert set(ratios) == set(RATIOS), lines[-1]


@no_cuda
def test_without_cuda_the_gpu_checks_are_collected_and_skipped(tmp_path):
    r, outcomes = _gpu_checks(tmp_path / "junit.xml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _files(outcomes) == {p.stem for p in GPU_TESTS.glob("test_*.py")}, outcomes
    assert set(outcomes.values()) == {"skipped"}, outcomes


@no_cuda
def test_the_gpu_checks_pass_on_the_cpu(tmp_path):
    """The checks' CPU twins: without tests/conftest.py (--confcutdir), whose hook skips `gpu` tests here."""
    r, outcomes = _gpu_checks(tmp_path / "junit.xml", "--confcutdir", str(GPU_TESTS),
                              env={"OSTINATO_GPU_TESTS_ON_CPU": "1", "OSTINATO_GPU_WORK": str(tmp_path / "work")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert _files(outcomes) == {p.stem for p in GPU_TESTS.glob("test_*.py")}, outcomes
    assert set(outcomes.values()) == {"passed"}, outcomes
    assert len(outcomes) == 16, sorted(outcomes)  # each check at the tiny shapes, float32 inputs only
    figures = next(line for line in r.stdout.splitlines() if line.startswith("gpu figures: "))
    assert {item.split("=")[0] for item in figures.removeprefix("gpu figures: ").split()} == set(FIGURES), figures
