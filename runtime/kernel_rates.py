"""Time a built CPU expert kernel and the dense GEMM on this host: the rates ostinato-calibrate writes into a
hardware spec.

    python -m ostinato.runtime.kernel_rates KERNEL.so --d 4096 --i 2048 [--threads N] ...   -> one JSON line

The compiler builds the kernel and writes the spec; running a kernel is the runtime's job, so the
compiler calls this as a process (the same boundary as the plan file: nothing is imported across).
Figures are the best of several rounds (a shared machine only makes calls slower).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ostinato.host import usable_cores
from ostinato.isa import detect_isa

from .kernels.cpu_experts import CpuExpertKernel
from .kernels.routes import GroupedRoutes, group_routes
from .kernels.testing import random_packed_expert
from .model import bf16_widening

ROUTED = 6   # experts per call at 1 token (a decode step's top-6)
BATCH = 64   # tokens per expert for the compute rate
DENSE_TOKENS = 512  # a prefill chunk's tokens for the dense GEMM's rate, over a [D, D] matrix


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


def measure(kernel_path: str, D: int, I: int, threads: int, n_experts: int, dtype: torch.dtype,
            rounds: int) -> dict:
    """Host read bandwidth, the kernel's packed-byte rate at 1 token per expert (every call on experts
    not in any cache) and its FLOP rate at BATCH tokens per expert."""
    torch.set_num_threads(threads)
    kernel = CpuExpertKernel(kernel_path)
    gen = torch.Generator().manual_seed(0)
    experts = [random_packed_expert(D, I, gen) for _ in range(n_experts)]
    table = kernel.table(experts)
    expert_bytes = experts[0].nbytes

    buf = torch.ones(256 * 2**20, dtype=torch.float32)  # 1 GiB, beyond any cache
    read_bw = buf.numel() * 4 / best_seconds(buf.sum, rounds)
    del buf

    x1, out1 = torch.randn(1, D).to(dtype), torch.zeros(1, D)
    cycle = [routes(list(range(i, i + ROUTED)), n_experts, 1) for i in range(0, n_experts - ROUTED + 1, ROUTED)]
    one = min(best_seconds(lambda r=r: kernel(x1, r, table, out1, threads), 1) for _ in range(rounds) for r in cycle)

    xb, outb = torch.randn(BATCH, D).to(dtype), torch.zeros(BATCH, D)
    batch = routes([0, 1], n_experts, BATCH)
    many = best_seconds(lambda: kernel(xb, batch, table, outb, threads), rounds)
    dense_dtype, dense = dense_rate(D, dtype, rounds)
    return {"isa": detect_isa(), "threads": threads, "read_bandwidth": read_bw,
            "expert_read_bandwidth": ROUTED * expert_bytes / one,
            "expert_flops": 2 * BATCH * (2 * 3 * D * I) / many, "batch": BATCH,
            "dense_flops": dense, "dense_dtype": dense_dtype, "dense_tokens": DENSE_TOKENS}


def dense_rate(D: int, dtype: torch.dtype, rounds: int) -> tuple[str, float]:
    """(the dtype, FLOP/s) of a prefill's dense products here: torch's GEMM of DENSE_TOKENS tokens by a [D, D]
    matrix, in bf16 where the runtime multiplies bf16 activations in bf16 (a host with bf16 arithmetic,
    model/bf16_widening.py), else in float32 (the widened slabs' GEMM)."""
    gemm = torch.bfloat16 if dtype == torch.bfloat16 and bf16_widening.NATIVE_BF16 else torch.float32
    x, w = torch.randn(DENSE_TOKENS, D).to(gemm), torch.randn(D, D).to(gemm)
    x @ w.T  # the first call sets up the GEMM library's buffers
    return str(gemm).removeprefix("torch."), 2 * DENSE_TOKENS * D * D / best_seconds(lambda: x @ w.T, rounds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ostinato.runtime.kernel_rates", description=__doc__.splitlines()[0])
    ap.add_argument("kernel", help="the built CPU expert kernel library")
    ap.add_argument("--d", type=int, required=True, help="hidden size the kernel was built for")
    ap.add_argument("--i", type=int, required=True, help="expert width the kernel was built for")
    ap.add_argument("--threads", type=int, default=usable_cores())
    ap.add_argument("--experts", type=int, default=48)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    print(json.dumps(measure(a.kernel, a.d, a.i, a.threads, a.experts, dtype, a.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
