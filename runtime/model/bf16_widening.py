"""bf16 products of many tokens on the CPU, a slab of the weight's rows at a time: in float32 on a CPU without
bf16 arithmetic, and for a matrix stored in another format (FP8) in the dtype the host computes fastest.

torch's CPU GEMM in bf16 converts its operands inside the kernel; without AVX512-BF16 or AMX (an AVX2-only
Zen 3, an AVX-512 Skylake) it runs at a fraction of its float32 rate: a V4-Flash slice's 128-token prefill
spent 92% of its 19.6 s in bf16 `mm` / `bmm` on a 2-core Zen 3. Widening the weight to float32 for the call
is 1.5-5.8x faster from 16 tokens on (`python -m ostinato.bench.bf16_matmul`), but widening it whole writes a
fresh float32 copy (twice the matrix's bytes, 128 MB for V4-Flash's wq_b) whose page faults cost more than
the product at 16-64 tokens. So the weight is widened a slab of rows at a time into one small buffer that
stays in cache (SLAB_ELEMENTS), each slab's product written straight into its rows of the output:

    out^T[r:r+R] = widen(W[r:r+R]) @ x^T        x [T, K] float32 (widened once), W [N, K] bf16

The result is the float32 sum of the same exact products (a bf16 x bf16 product is exact in float32),
rounded to bf16 once, as torch's bf16 GEMM does (it too accumulates in float32): the two differ only in
summation order. One token keeps torch's bf16 path (a GEMV bound by the bytes read, where bf16's half size
wins), and so does a host with bf16 arithmetic, and a step torch.compile traces (Inductor generates its own).

A matrix stored in another format (the checkpoint's FP8) is read the same way, its slabs filled by a decoder
(model/fp8_matrix.py): widened to float32 (`slab_product`), or, on a host with bf16 arithmetic and a bf16 x,
decoded to bf16 (exact: an e4m3 weight times a power of two has 4 significant bits) and multiplied by torch's
bf16 GEMM, which accumulates in float32 and rounds once (`bf16_slab_product`; `python -m
ostinato.bench.fp8_prefill` on a 2-core Zen 4 with AVX512-BF16, V4-Flash's wq_a, wq_b and wo_b: 1.2-1.4x the
float32 slabs' rate at 16 tokens, 1.8-2.0x at 64, 2.3-2.9x at 200, 2.0-2.7x at 512).

Legend: T tokens, K inputs, N output rows, R slab rows, G groups.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ostinato.isa import supports

from .fused import inductor_generates

# From this many tokens on the widened product is faster (bench/bf16_matmul.py on a 2-core AMD EPYC Zen 3,
# V4-Flash's [1024, 4096], [32768, 1024] and [4096, 8192]: at 16 tokens 1.5x, 2.8x and 2.3x, at 8 tokens
# 0.6x, 0.8x and 0.8x, at 128 tokens 4.4-5.8x).
WIDEN_MIN_TOKENS = 16
# Elements of the float32 slab buffer (4 MB: within the L3 of the CPUs this targets; 1M beat 256K and 512K
# at 512 tokens and tied at 16-128 in the same comparison run by hand).
SLAB_ELEMENTS = 1 << 20


def _native_bf16() -> bool:
    """Whether this CPU computes in bf16 (AVX512-BF16, which every AMX CPU has; OSTINATO_ISA below avx512_bf16
    says no, as an AVX2 host's engine would: ostinato/isa.py); unknown counts as yes, which keeps torch's own
    path."""
    try:
        return supports("avx512_bf16")
    except (OSError, RuntimeError):
        return True


# Read once at import: a compiled step's trace reads it as a constant (tests set it to try both paths).
NATIVE_BF16 = _native_bf16()


def widens(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether x [..., T, K] @ w^T goes through widened_linear (module docstring)."""
    return (x.dtype == w.dtype == torch.bfloat16 and x.device.type == "cpu" and w.device.type == "cpu"
            and x.dim() >= 2 and x.shape[-2] >= WIDEN_MIN_TOKENS and not inductor_generates() and not NATIVE_BF16)


def widened_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., T, K] bf16 @ W[N, K]^T bf16 -> [..., T, N] bf16, in float32 a slab of W's rows at a time."""
    return slab_product(x, w.shape[0], lambda r0, r1, part: part.copy_(w[r0:r1])).to(torch.bfloat16)


def slab_rows(K: int, align: int) -> int:
    """Rows of a slab of K-wide rows: at most SLAB_ELEMENTS values, a multiple of `align` (at least one `align`)."""
    return max(align, SLAB_ELEMENTS // K // align * align)


def slab_product(x: torch.Tensor, N: int, fill: Callable[[int, int, torch.Tensor], object],
                 align: int = 1) -> torch.Tensor:
    """x [..., T, K] @ W[N, K]^T -> [..., T, N] float32, where fill(r0, r1, part) writes W's rows r0..r1-1
    in float32 into part [r1 - r0, K]: a slab of at most SLAB_ELEMENTS (a multiple of `align` rows) at a time."""
    lead, K = x.shape[:-1], x.shape[-1]
    xt = x.reshape(-1, K).float().T.contiguous()  # [K, T'] (T' = all leading positions)
    out = torch.empty(N, xt.shape[1], dtype=torch.float32)  # [N, T']: each slab's rows are contiguous
    rows = slab_rows(K, align)
    slab = torch.empty(min(rows, N), K, dtype=torch.float32)
    for r in range(0, N, rows):
        part = slab[:min(rows, N - r)]
        fill(r, r + part.shape[0], part)  # [R, K] widened
        torch.mm(part, xt, out=out[r:r + rows])  # [R, K] @ [K, T'] -> [R, T']
    return out.T.reshape(*lead, N)


def bf16_slab_product(x: torch.Tensor, N: int, fill: Callable[[int, int, torch.Tensor], object],
                      align: int = 1) -> torch.Tensor:
    """x [..., T, K] bf16 @ W[N, K]^T -> [..., T, N] bf16 on a host with bf16 arithmetic, where fill(r0, r1, part)
    writes W's rows r0..r1-1 in bf16 (exactly) into part [r1 - r0, K]: a slab at a time, as slab_product. Each
    slab's product is torch's bf16 GEMM (float32 sums rounded once) written into its own [T, R] block, so the
    output's transpose is a copy of whole R-value runs, not the element-wise one slab_product's [N, T] needs."""
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K)  # [T', K]
    rows = slab_rows(K, align)
    slabs = -(-N // rows)
    out = torch.empty(slabs, x2.shape[0], rows, dtype=torch.bfloat16)  # [S, T', R]: slab s's product is out[s]
    slab = torch.empty(min(rows, N), K, dtype=torch.bfloat16)
    for s, r in enumerate(range(0, N, rows)):
        part = slab[:min(rows, N - r)]
        fill(r, r + part.shape[0], part)  # [R, K] decoded
        torch.mm(x2, part.T, out=out[s, :, :part.shape[0]])  # [T', K] @ [K, R] -> [T', R]
    return out.transpose(0, 1).reshape(x2.shape[0], slabs * rows)[:, :N].reshape(*lead, N)


def widened_grouped(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [G, T, K] bf16, W [G*M, K] bf16 (group g: rows g*M..(g+1)*M-1) -> [G, T, M] bf16."""
    G = x.shape[0]
    M = w.shape[0] // G
    return torch.stack([widened_linear(x[g], w[g * M:(g + 1) * M]) for g in range(G)])


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul(a, b) of two activations (attention's scores and weighted values): a bf16 pair on a CPU
    without bf16 arithmetic is widened whole, at any token count (neither is a weight read from memory, and
    torch's bf16 batched products there are the slowest: V4-Flash's [64, 128] x [128, 512] per token took
    839 ms at 128 tokens against 38 widened, 7.0 against 1.1 ms at one token, same bench machine)."""
    if a.dtype == b.dtype == torch.bfloat16 and a.device.type == "cpu" and not NATIVE_BF16:
        return torch.matmul(a.float(), b.float()).to(torch.bfloat16)
    return torch.matmul(a, b)
