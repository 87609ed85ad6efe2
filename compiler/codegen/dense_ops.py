"""The row-wise dense-op kernels a plan needs (templates/*/dense_ops.*.j2): RMS norms, rotary
embedding, the head's logits and the FP8 matrices' products for a few tokens, for the host (C++) and the GPUs
(Triton). They take every size at run time; the host library's parameters are the plan's host ISA (like the
expert kernel's; CODE_PATHS) and measured tuning constants (HEAD_PREFETCH_BYTES, HEAD_ROWS, FP8_PREFETCH_BYTES,
FP8_ROWS, FP8_BF16_ROWS). The content hash names them by their text, parameters and flags."""

from __future__ import annotations

from pathlib import Path

from ostinato.isa import KERNEL_VARIANTS, kernel_variant

from .cxx import BASE_FLAGS, compile_shared
from .isa import isa_flags
from .render import KernelRecord, render

CPU_TEMPLATE = "cpu/dense_ops.cpp.j2"
TRITON_TEMPLATE = "triton/dense_ops.py.j2"

# The host library's code paths, the expert kernel's (ostinato/isa.py KERNEL_VARIANTS): every AVX-512 ISA builds
# 16-float vectors for the head and the FP8 products; avx512_bf16 (and amx, which builds it) adds the FP8 products
# on bf16 activations with vdpbf16ps (the template's OST_BF16DOT).
CODE_PATHS = KERNEL_VARIANTS
MAX_ROWS = 8  # rows sharing a load of x: the most the template's register blocking is meant for


def code_path(isa: str) -> str:
    """The code path of CODE_PATHS a spec ISA builds."""
    return kernel_variant(isa)


# How far ahead the head's rows are prefetched, in bytes (0: the hardware prefetcher alone). Measured by
# bench/head_kernel.py on the same 2-core AMD EPYC Zen 3 VM on two days, 129,280 rows, GB/s at 0 / 2 / 4 / 8 KB:
# 2026-12-01, hidden 256 (66 MB) 17.0 / 17.8 / 18.1 / 18.1, hidden 4,096 (1 GB) 16.8 / 17.8 / 18.0 / 17.0;
# 2026-12-03 (its float32 stream at 32 GB/s), hidden 256 31.9 / 31.5 / 32.3 / 32.0, hidden 4,096 21.6 / 17.2 /
# 16.7 / 17.2. Prefetching gained 7% the first day and cost 23% the second: none.
HEAD_PREFETCH_BYTES = 0

# The FP8 products' prefetch distance in bytes and rows sharing each load of x at one token (the template's
# FP8_PREFETCH_BYTES, FP8_ROWS). Measured by bench/fp8_linear.py on a 2-core Zen 3, 2026-12-03, GB/s of FP8 bytes
# at one token without prefetch / with it: [32768, 1024] 6.9 / 12.6, [4096, 8192] 13.4 / 10.9 (the next rows 32 KB
# ahead), [1024, 4096] 8.3 / 7.6. On a 2-core Zen 4 (AVX-512 code) the same day, at 4 / 8 rows without prefetch and
# with it: [1024, 4096] 9.2 / 10.1, 11.0 / 10.0; [32768, 1024] 9.4 / 10.8, 15.4 / 9.2; [4096, 8192] 17.0 / 16.7,
# 17.0 / 17.2 (8 rows gained at two tokens on two shapes, lost on one).
# avx512_bf16's path for a bf16 plan's bf16 x (vdpbf16ps) reads one row at a time with no software prefetch:
# one core of the same Zen 4, 16 copies of a [4096, 4096] matrix, GB/s: one row 15-21 (a plain read 17-23), four
# rows sharing x or a 1-4 KB prefetch 8-17 (docs/benchmarks.md, "FP8 products on bf16 dot products").
FP8_PREFETCH_BYTES = 4096
FP8_ROWS = 4
# Rows sharing each load of x on that bf16 path where rows are long (the template's FP8_BF16_ROWS, from K 6,144:
# the template has the figures): at V4-Flash's wo_b ([4096, 8192]) one row at a time re-reads x from L2.
FP8_BF16_ROWS = 4

# Head rows that share each load of x at one token where rows are long (the template's HEAD_ROWS; from hidden
# 2,048). Measured by bench/head_kernel.py on a 2-core AMD EPYC (Zen 4, AVX-512), 2026-12-03, hidden 4,096,
# GB/s at 1 / 4 rows: AVX2 code 21.0 / 27.2, AVX-512 code 24.8 / 26.8 and 21.2 / 26.5 (float32 stream 30-43);
# at hidden 256 four rows halved the rate (avx512 25.3 / 13.3, avx2 27.7 / 12.9): rows that short go one by one.
HEAD_ROWS = 4


def build_cpu_dense_ops(root: str | Path | None = None, head_prefetch_bytes: int = HEAD_PREFETCH_BYTES,
                        isa: str = "avx2", head_rows: int = HEAD_ROWS, fp8_prefetch_bytes: int = FP8_PREFETCH_BYTES,
                        fp8_rows: int = FP8_ROWS, fp8_bf16_rows: int = FP8_BF16_ROWS) -> KernelRecord:
    """Render and compile the host kernels for a spec's host ISA (its kernel variant: avx2, or an AVX-512 one
    where the head and the FP8 products use 16-float vectors, and avx512_bf16's vdpbf16ps FP8 products on bf16
    activations); the record's path is the shared library.
    The tuning constants (other values: a bench's): see HEAD_PREFETCH_BYTES, HEAD_ROWS, FP8_PREFETCH_BYTES, FP8_ROWS,
    FP8_BF16_ROWS."""
    for name, rows in (("head_rows", head_rows), ("fp8_rows", fp8_rows), ("fp8_bf16_rows", fp8_bf16_rows)):
        if not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"{name}: 1 to {MAX_ROWS} rows share a load of x, not {rows}")
    params = {"head_prefetch_bytes": int(head_prefetch_bytes), "isa": kernel_variant(isa), "head_rows": int(head_rows),
              "fp8_prefetch_bytes": int(fp8_prefetch_bytes), "fp8_rows": int(fp8_rows),
              "fp8_bf16_rows": int(fp8_bf16_rows)}
    return compile_shared(render(CPU_TEMPLATE, params, flags=(*BASE_FLAGS, *isa_flags(isa)), root=root))


def render_triton_dense_ops(root: str | Path | None = None) -> KernelRecord:
    """Render the Triton module; the record's path is the .py file."""
    return render(TRITON_TEMPLATE, {}, root=root)
