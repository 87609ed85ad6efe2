"""The row-wise dense-op kernels a plan needs (templates/*/dense_ops.*.j2): RMS norms, rotary
embedding and the head's logits for a few tokens, for the host (C++) and the GPUs (Triton). They
take every size at run time; their one parameter is the head's prefetch distance, a tuning constant
(HEAD_PREFETCH_BYTES). The content hash names them by their text, parameters and flags."""

from __future__ import annotations

from pathlib import Path

from .cxx import BASE_FLAGS, compile_shared
from .isa import isa_flags
from .render import KernelRecord, render

CPU_TEMPLATE = "cpu/dense_ops.cpp.j2"
TRITON_TEMPLATE = "triton/dense_ops.py.j2"


# How far ahead the head's rows are prefetched, in bytes (0: the hardware prefetcher alone). Measured by
# bench/head_kernel.py on the same 2-core AMD EPYC Zen 3 VM on two days, 129,280 rows, GB/s at 0 / 2 / 4 / 8 KB:
# 2026-12-01, hidden 256 (66 MB) 17.0 / 17.8 / 18.1 / 18.1, hidden 4,096 (1 GB) 16.8 / 17.8 / 18.0 / 17.0;
# 2026-12-03 (its float32 stream at 32 GB/s), hidden 256 31.9 / 31.5 / 32.3 / 32.0, hidden 4,096 21.6 / 17.2 /
# 16.7 / 17.2. Prefetching gained 7% the first day and cost 23% the second: none.
HEAD_PREFETCH_BYTES = 0


def build_cpu_dense_ops(root: str | Path | None = None,
                        head_prefetch_bytes: int = HEAD_PREFETCH_BYTES) -> KernelRecord:
    """Render and compile the host kernels for AVX2 (every host ISA a spec may name has it); the record's
    path is the shared library. `head_prefetch_bytes`: see HEAD_PREFETCH_BYTES (another value: a bench's)."""
    return compile_shared(render(CPU_TEMPLATE, {"head_prefetch_bytes": int(head_prefetch_bytes)},
                                 flags=(*BASE_FLAGS, *isa_flags("avx2")), root=root))


def render_triton_dense_ops(root: str | Path | None = None) -> KernelRecord:
    """Render the Triton module; the record's path is the .py file."""
    return render(TRITON_TEMPLATE, {}, root=root)
