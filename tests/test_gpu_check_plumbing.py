"""tools/gpu_check.py off the GPU. A GPU run is rare and short, so everything up to the CUDA calls is
run here: without CUDA the tool names the measurements that stay unverified and exits 0; with --cpu
it runs every measurement on the CPU (the tiny model's shapes, Triton's interpreter, the decode
graphs' eager twin), its checks pass, and its last line has every ratio the GPU run will report.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"
RATIOS = ("decode_bw/peak", "prefill16/model", "h2d/link", "overlap", "hostnode/model", "eager/graph",
          "bf16_err/cpu_bf16", "greedy_agree", "dynamic/graph", "held/plan_gpu0", "fp8_gemv_bw/peak", "fp8_gemm_flops/spec")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real check")
def test_without_cuda_it_lists_what_stays_unverified():
    r = _run()
    assert r.returncode == 0, r.stderr
    assert "UNVERIFIED" in r.stdout
    for name in ("kernels", "decode", "prefill", "upload", "hostnode", "step", "bucket", "memory"):
        assert f"  {name} " in r.stdout
    assert _run("--only", "nope").returncode == 2


def test_cpu_mode_runs_every_measurement_and_its_checks_pass(tmp_path):
    r = _run("--cpu", "--build-root", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "FAIL" not in r.stdout and "raised" not in r.stdout, r.stdout
    assert lines[-2].startswith("gpu_check: 15 of 15 checks ok"), lines[-2]
    ratios = dict(item.split("=") for item in lines[-1].removeprefix("ratios: ").split())
    assert set(ratios) == set(RATIOS), lines[-1]
