"""Benchmark the generated CPU expert kernel on this machine, side by side in one run.

DeepSeek-V4-Flash's expert shape (D=4096, I=2048; 13.4 MB packed MXFP4 per expert):
(a) memory read bandwidth: a streaming sum over a 2 GiB buffer with all threads;
(b) the kernel's effective weight bandwidth (packed bytes of the experts read / time) for 1 token x
    1..6 experts, bf16 and float32 activations, cycling through > 1 GB of distinct experts (from DRAM);
(c) time per expert with T = 1..64 tokens all routed to it: the kernel with float32 and bf16
    activations, its GEMM-library path (bf16 tiles to MKL's cblas_gemm_bf16bf16f32, where torch exports
    it and the build has AVX512_BF16), torch float32 and bf16 matmuls on the same weights pre-dequantized;
(d) the crossover of (c): the fewest tokens per expert from which the GEMM path beats the kernel's own
    at every larger count, i.e. the gemm_min_tokens to plan (0: never);
(e) the kernel's compute ceiling: 1 token x 1 expert again and again (its 13.4 MB stay in the L3 cache).
Machines here are shared and noisy: every figure is the best of several interleaved rounds.
Last line: `cpu_expert_read_bw_ratio=R torch_speedup_min=S per_core_gbs=G`, where R is (b) with 6
experts and bf16 activations over (a), S the smallest (best torch time / kernel bf16 time) over the token
counts, and G is R's bandwidth per thread.

The side-by-side with other systems' CPU expert kernels (KTransformers' kt-kernel, llama.cpp's ggml) and
the simulator's kernel tables (bench/measured/cpu_expert_kernels.<isa>.yaml) moved to
`python -m ostinato.bench.kernel_side_by_side`, which drives each system on whole-layer calls as its own
benchmark drives it.

Usage: python -m ostinato.bench.cpu_experts [--threads N] [--build-root DIR]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from ostinato.compiler.codegen.kernels import build_cpu_experts, host_cpu_params
from ostinato.runtime.kernels.cpu_experts import CpuExpertKernel
from ostinato.runtime.kernels.reference import dequantize_expert
from ostinato.runtime.kernels.routes import GroupedRoutes
from ostinato.runtime.kernels.testing import random_packed_expert

D, I = 4096, 2048
N_EXPERTS = 80        # 80 x 13.4 MB = 1.07 GB of packed experts: far beyond the L3 cache
N_DENSE = 6           # torch baseline: 6 x 100 MB float32 (and bf16) experts, also beyond the L3
TOKENS = (1, 2, 4, 8, 16, 32, 64)
ROUNDS = 3


def timed(fn, calls: int) -> float:
    """Best seconds of `calls` calls of fn()."""
    best = float("inf")
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def read_bandwidth(buf: torch.Tensor) -> float:
    """Bytes/s of a multi-threaded streaming sum (torch's vectorized reduction)."""
    return buf.numel() * buf.element_size() / timed(buf.sum, 3)


def routes_for(first: int, n_experts: int, n_tokens: int) -> GroupedRoutes:
    """All n_tokens routed to each of n_experts consecutive experts (cyclic) out of N_EXPERTS."""
    counts = torch.zeros(N_EXPERTS, dtype=torch.int64)
    counts[[(first + j) % N_EXPERTS for j in range(n_experts)]] = n_tokens
    offsets = torch.zeros(N_EXPERTS + 1, dtype=torch.int64)
    offsets[1:] = counts.cumsum(0)
    tok = torch.arange(n_tokens).repeat(n_experts)
    # token order must ascend inside each expert's range, which repeat() gives
    return GroupedRoutes(offsets, tok, torch.full((n_tokens * n_experts,), 0.5))


class Ours:
    """The kernel on cycling experts: each call reads experts the previous calls did not."""

    def __init__(self, kern: CpuExpertKernel, table, threads: int):
        self.kern, self.table, self.threads, self.next = kern, table, threads, 0

    def time(self, n_experts: int, n_tokens: int, dtype: torch.dtype, calls: int) -> float:
        x, out = torch.randn(n_tokens, D).to(dtype), torch.zeros(n_tokens, D)
        best = float("inf")
        for _ in range(calls):
            r = routes_for(self.next, n_experts, n_tokens)
            self.next = (self.next + n_experts) % N_EXPERTS
            t = time.perf_counter()
            self.kern(x, r, self.table, out, self.threads)
            best = min(best, time.perf_counter() - t)
        return best

    def time_same(self, calls: int) -> float:
        """1 token on expert 0, `calls` times in a row (cache-resident after the first)."""
        x, out, r = torch.randn(1, D).bfloat16(), torch.zeros(1, D), routes_for(0, 1, 1)
        return timed(lambda: self.kern(x, r, self.table, out, self.threads), calls)


def torch_time(dense: list, n_tokens: int, dtype: torch.dtype, calls: int) -> float:
    x, out = torch.randn(n_tokens, D), torch.zeros(n_tokens, D)
    lin = torch.nn.functional.linear
    best = float("inf")
    for i in range(calls):
        w1, w3, w2 = dense[i % len(dense)]
        t = time.perf_counter()
        xc = x.to(dtype)
        g = lin(xc, w1).clamp(max=10.0)
        u = lin(xc, w3).clamp(-10.0, 10.0)
        out.add_(0.5 * lin(torch.nn.functional.silu(g) * u, w2).float())
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--build-root", default=None, help="kernel build directory (default build/kernels)")
    args = ap.parse_args()
    threads = args.threads
    torch.set_num_threads(threads)

    params = host_cpu_params(D, I)
    kern = CpuExpertKernel(build_cpu_experts(params, root=args.build_root).path, gemm=False)
    print(f"kernel: {kern.info}  threads={threads}")
    g = torch.Generator().manual_seed(0)
    experts = [random_packed_expert(D, I, g) for _ in range(N_EXPERTS)]
    ours = Ours(kern, kern.table(experts), threads)
    expert_bytes = experts[0].nbytes
    print(f"{N_EXPERTS} experts x {expert_bytes:,} B = {N_EXPERTS * expert_bytes / 1e9:.2f} GB packed")

    # The GEMM path on every count from 2 (GEMV only for 1 token): a build of its own
    gemm, why = None, ""
    if params.isa in ("avx512_bf16", "amx"):
        forced = CpuExpertKernel(build_cpu_experts(host_cpu_params(D, I, gemv_max_tokens=1, gemm_min_tokens=2),
                                                   root=args.build_root).path)
        gemm = Ours(forced, forced.table(experts), threads) if forced.gemm else None
        why = "" if gemm else "torch exports no cblas_gemm_bf16bf16f32 (no MKL)"
    else:
        why = f"the {params.isa} build has no bf16 path"
    # (a) + (b), interleaved rounds
    buf = torch.ones(512 * 2**20, dtype=torch.float32)  # 2 GiB
    bw, kbw = 0.0, {(n, dt): 0.0 for dt in (torch.bfloat16, torch.float32) for n in range(1, 7)}
    for _ in range(ROUNDS):
        bw = max(bw, read_bandwidth(buf))
        for (n, dt), v in kbw.items():
            kbw[n, dt] = max(v, n * expert_bytes / ours.time(n, 1, dt, calls=N_EXPERTS // n // 2))
    del buf
    print(f"\n(a) memory read bandwidth: {bw / 1e9:.1f} GB/s ({bw / threads / 1e9:.1f} per thread)")
    print("(b) 1 token: experts | bf16: us/expert  GB/s  of read bw | float32: us/expert  GB/s  of read bw")
    for n in range(1, 7):
        b, f = kbw[n, torch.bfloat16], kbw[n, torch.float32]
        print(f"    {n:>7} | {expert_bytes / b * 1e6:16.0f} {b / 1e9:5.1f} {b / bw:11.0%} | "
              f"{expert_bytes / f * 1e6:19.0f} {f / 1e9:5.1f} {f / bw:11.0%}")

    # (c) per token count; rounds interleave the contenders
    dense32 = [tuple(w.contiguous() for w in dequantize_expert(e)) for e in experts[:N_DENSE]]
    dense16 = [tuple(w.bfloat16() for w in d) for d in dense32]
    names = ["f32", "bf16", "gemm", "torch32", "torch16"]
    best = {(T, k): float("inf") for T in TOKENS for k in names}

    def one_round(T: int, calls: int) -> dict:
        got = {"f32": ours.time(1, T, torch.float32, calls), "bf16": ours.time(1, T, torch.bfloat16, calls),
               "torch32": torch_time(dense32, T, torch.float32, calls),
               "torch16": torch_time(dense16, T, torch.bfloat16, calls)}
        if gemm and T > 1:
            got["gemm"] = gemm.time(1, T, torch.bfloat16, calls)
        return got
    for _ in range(ROUNDS):
        for T in TOKENS:
            for k, v in one_round(T, 4 if T <= 8 else 2).items():
                best[T, k] = min(best[T, k], v)
    print("\n(c) ms per expert, all tokens routed to it (bf16: bf16 activations; gemm: bf16 tiles to the "
          "GEMM library; torch on pre-dequantized weights)")
    print("    tokens |   f32 |  bf16 |  gemm | torch f32 | torch bf16 | bf16 vs torch | f32 vs torch f32 | "
          "bf16 GB/s/thread")
    speedups = []
    for T in TOKENS:
        b = {k: best[T, k] * 1e3 for k in names}
        s = min(b["torch32"], b["torch16"]) / b["bf16"]
        speedups.append(s)
        def cell(v: float) -> str:
            return f"{v:5.2f}" if v != float("inf") else "    -"
        print(f"    {T:>6} | {cell(b['f32'])} | {cell(b['bf16'])} | {cell(b['gemm'])} | {b['torch32']:9.2f} | "
              f"{b['torch16']:10.2f} | {s:12.2f}x | {b['torch32'] / b['f32']:15.2f}x | "
              f"{expert_bytes / best[T, 'bf16'] / threads / 1e9:16.1f}")

    # (d) the crossover to plan
    if gemm:
        wins = [T for T in TOKENS if T > 1 and best[T, "gemm"] < best[T, "bf16"]]
        tail = [T for T in wins if all(best[U, "gemm"] < best[U, "bf16"] for U in TOKENS if U >= T)]
        cross = min(tail) if tail else 0
        print(f"\n(d) GEMM path vs the kernel's own: faster at {wins or 'no token count'}; plan "
              f"gemm_min_tokens={cross}" + ("" if cross else " (never)"))
    else:
        print(f"\n(d) GEMM path: not measured ({why})")

    # (e) compute ceiling: the same expert over and over (cache-resident after the first call)
    hot = max(expert_bytes / ours.time_same(calls=30) for _ in range(ROUNDS))
    print(f"\n(e) 1 token, 1 cache-resident expert: {hot / 1e9:.1f} GB/s = {hot / bw:.0%} of the read bandwidth "
          "(the kernel's compute ceiling)")
    r = kbw[6, torch.bfloat16]
    print(f"cpu_expert_read_bw_ratio={r / bw:.3f} torch_speedup_min={min(speedups):.3f} "
          f"per_core_gbs={r / threads / 1e9:.2f}")


if __name__ == "__main__":
    main()
