"""The row-wise dense-op kernels a plan needs (templates/*/dense_ops.*.j2): RMS norms, rotary
embedding and the head's logits for a few tokens, for the host (C++) and the GPUs (Triton). They
take every size at run time, so they have no parameters; the content hash still names them by
their text and flags."""

from __future__ import annotations

from pathlib import Path

from .cxx import BASE_FLAGS, compile_shared
from .isa import isa_flags
from .render import KernelRecord, render

CPU_TEMPLATE = "cpu/dense_ops.cpp.j2"
TRITON_TEMPLATE = "triton/dense_ops.py.j2"


def build_cpu_dense_ops(root: str | Path | None = None) -> KernelRecord:
    """Render and compile the host kernels for AVX2 (every host ISA a spec may name has it); the record's
    path is the shared library."""
    return compile_shared(render(CPU_TEMPLATE, {}, flags=(*BASE_FLAGS, *isa_flags("avx2")), root=root))


def render_triton_dense_ops(root: str | Path | None = None) -> KernelRecord:
    """Render the Triton module; the record's path is the .py file."""
    return render(TRITON_TEMPLATE, {}, root=root)
