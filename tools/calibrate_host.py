"""Measure this host's CPU expert rates and write them into a hardware spec for ostinato-compile.

The cost model prices cold experts with the host's `expert_read_bandwidth` (bytes/s of packed MXFP4
read at 1 token per expert, the decode and short-prefill case) and `expert_flops` (FLOP/s at 64
tokens per expert, long prefills); without them it falls back to the spec's DRAM bandwidth and
matmul rate, which the generated kernel does not reach (1 token: about a third of the read
bandwidth on 2 cores). This builds the project's CPU kernel for this CPU's ISA at DeepSeek-V4-Flash's
expert shape (D=4096, I=2048), times it with this process's cores over more experts than the caches
hold, and writes BASE with the host's fields replaced by what it measured:

    python tools/calibrate_host.py rtx4090d-x4 build/my-box.yaml      # a preset, or a spec file
    ostinato-compile MODEL plan.yaml --hardware build/my-box.yaml

Figures are the best of several rounds (a shared machine only makes calls slower). Activations are
bf16 (what GPU plans send the CPU) unless --dtype float32.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import torch

from ostinato.compiler.codegen.kernels import build_cpu_experts, host_cpu_params
from ostinato.hardware import load_hardware
from ostinato.isa import detect_isa
from ostinato.runtime.engine.cpu_threads import usable_cores
from ostinato.runtime.kernels.cpu_experts import CpuExpertKernel
from ostinato.runtime.kernels.routes import GroupedRoutes, group_routes
from ostinato.runtime.kernels.testing import random_packed_expert
from ostinato.yaml_files import dump_yaml

D, I = 4096, 2048
EXPERT_FLOPS = 2 * 3 * D * I  # one token through gate, up and down
ROUTED = 6                    # experts per call at 1 token (a decode step's top-6)
BATCH = 64                    # tokens per expert for the compute rate


def best_seconds(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def routes(experts: list[int], n_table: int, tokens: int) -> GroupedRoutes:
    """`tokens` tokens routed to each expert of `experts` (distinct) of an n_table table."""
    ids = torch.tensor(experts).repeat(tokens, 1)  # [tokens, len(experts)]
    return group_routes(ids, torch.full(ids.shape, 0.5), n_table)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="hardware spec to start from: a preset name or a YAML file")
    ap.add_argument("out", type=Path, help="the calibrated spec to write")
    ap.add_argument("--threads", type=int, default=usable_cores(), help="kernel threads (default: this process's cores)")
    ap.add_argument("--experts", type=int, default=48, help="distinct experts cycled through (48: 640 MB)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="activations")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    if a.experts < 2 * ROUTED:
        ap.error(f"--experts must be at least {2 * ROUTED}")
    base = load_hardware(a.base)
    torch.set_num_threads(a.threads)
    isa = detect_isa()
    kernel = CpuExpertKernel(build_cpu_experts(host_cpu_params(D, I)).path)
    gen = torch.Generator().manual_seed(0)
    experts = [random_packed_expert(D, I, gen) for _ in range(a.experts)]
    table = kernel.table(experts)
    dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    expert_bytes = experts[0].nbytes

    buf = torch.ones(256 * 2**20, dtype=torch.float32)  # 1 GiB, beyond any cache
    read_bw = buf.numel() * 4 / best_seconds(buf.sum, a.rounds)
    del buf

    # 1 token x ROUTED experts per call, each call on the next experts: every byte comes from DRAM
    x1, out1 = torch.randn(1, D).to(dtype), torch.zeros(1, D)
    cycle = [routes(list(range(i, i + ROUTED)), a.experts, 1) for i in range(0, a.experts - ROUTED + 1, ROUTED)]
    one = min(best_seconds(lambda r=r: kernel(x1, r, table, out1, a.threads), 1) for _ in range(a.rounds)
              for r in cycle)
    expert_read_bw = ROUTED * expert_bytes / one

    xb, outb = torch.randn(BATCH, D).to(dtype), torch.zeros(BATCH, D)
    batch = routes([0, 1], a.experts, BATCH)
    many = best_seconds(lambda: kernel(xb, batch, table, outb, a.threads), a.rounds)
    expert_flops = 2 * BATCH * EXPERT_FLOPS / many

    when = datetime.date.today().isoformat()
    note = (f"tools/calibrate_host.py on {cpu_model()} ({isa}), {a.threads} threads, {a.dtype} activations, "
            f"{when}: read {read_bw / 1e9:.1f} GB/s; kernel {expert_read_bw / 1e9:.1f} GB/s at 1 token "
            f"({expert_read_bw / read_bw:.2f} of read), {expert_flops / 1e9:.0f} GFLOP/s at {BATCH} tokens")
    def rate(x: float) -> float:  # 3 significant digits: the rounds' noise is larger than that
        return float(f"{x:.3g}")

    host = base.host.replace(cores=a.threads, isa=isa, bandwidth=rate(read_bw), expert_read_bandwidth=rate(expert_read_bw),
                             expert_flops=rate(expert_flops), calibration=note)
    spec = base.replace(name=f"{base.name}-calibrated", host=host)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(f"# {base.name} with this host's CPU expert rates, measured by {note}\n"
                     + dump_yaml(spec.model_dump(mode="json", exclude_none=True)))
    print(note)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
