"""ostinato-calibrate measures the CPU expert kernel here and writes a spec whose host rates the
cost model then uses instead of the DRAM bandwidth and matmul constants; a CPU-only spec's "device" (the CPU)
gets the measured dense GEMM rate and read bandwidth."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ostinato.compiler.cli import calibrate
from ostinato.compiler.compile import CompileOptions, compile_plan
from ostinato.compiler.cost_model import host_expert_rates
from ostinato.hardware import load_hardware

pytestmark = pytest.mark.slow  # builds and times the CPU expert kernel


def test_a_calibrated_spec_prices_the_cold_experts_with_what_was_measured(tiny_ckpt, tmp_path, kernel_dir):
    spec = tmp_path / "calibrated.yaml"
    r = subprocess.run([sys.executable, "-m", "ostinato.compiler.cli.calibrate", "cpu-only", str(spec),
                        "--experts", "12", "--rounds", "1", "--kernel-dir", str(kernel_dir)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    calibrated = load_hardware(spec)
    host = calibrated.host
    assert host.expert_read_bandwidth > 0 and host.expert_flops > 0 and "ostinato-calibrate" in host.calibration
    dense = re.search(r"dense GEMM (\d+) GFLOP/s \((bfloat16|float32), 512 tokens\)", host.calibration)
    assert dense, host.calibration
    noted = int(dense.group(1))  # the spec keeps 3 significant digits of it
    assert noted > 0 and abs(calibrated.gpus.matmul_flops / 1e9 - noted) <= 0.01 * noted + 1
    assert calibrated.gpus.bandwidth == host.bandwidth  # the CPU's own read, measured
    # this host's memory: 7/8 of it usable, all of which the CPU device may use (one memory, counted once)
    memory = calibrate.host_memory_bytes()
    assert memory is not None and f"memory {memory / 2**30:.1f} GiB" in host.calibration
    assert host.usable_bytes == calibrated.gpus.usable_bytes == int(memory * 7 / 8) // 2**20 * 2**20
    assert host_expert_rates(host) == (host.expert_read_bandwidth, host.expert_flops)
    assert host_expert_rates(load_hardware("cpu-only").host) == (40e9, 100e9)  # uncalibrated: the spec's constants

    plans = {}
    for name, hardware in (("preset", "cpu-only"), ("calibrated", str(spec))):
        plans[name] = compile_plan(CompileOptions(tiny_ckpt, tmp_path / f"{name}.yaml", hardware, context=1024,
                                                  max_hot_per_layer=4, build_kernels=False)).plan
    assert any("not calibrated" in n for n in plans["preset"].notes)
    assert not any("not calibrated" in n for n in plans["calibrated"].notes)
    # the cold experts' price moved with the measured rates (everything else in the two specs is alike
    # but the host's read bandwidth, which only the CPU side uses)
    assert plans["preset"].predictions.prefill != plans["calibrated"].predictions.prefill
