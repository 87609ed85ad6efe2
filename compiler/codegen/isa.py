"""Compiler flags for each CPU expert kernel code path (the ISA list itself: ostinato/isa.py)."""

from __future__ import annotations

from ostinato.isa import KERNEL_VARIANTS, kernel_variant

_AVX512 = ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "avx512": _AVX512,
    "avx512_bf16": _AVX512 + ("-mavx512bf16", "-mavx512vnni", "-mavx512vbmi"),
}
assert tuple(ISA_FLAGS) == KERNEL_VARIANTS


def isa_flags(isa: str) -> tuple[str, ...]:
    """Compiler flags for a spec ISA."""
    return ISA_FLAGS[kernel_variant(isa)]
