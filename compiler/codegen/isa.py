"""Host ISA (detected by runtime/kernels/host_isa.py) mapped to compiler flags for the CPU expert kernel.

ISA names are the hardware spec's (avx2 / avx512 / avx512_bf16 / amx); the kernel template has
three code paths, so amx builds the avx512_bf16 variant (every AMX CPU has AVX512-BF16).
"""

from __future__ import annotations

from ...runtime.kernels.host_isa import ISAS, cpu_flags, detect_isa  # noqa: F401  (re-exported)

# Kernel variant (the template's `isa` constant) for each spec ISA.
KERNEL_ISA = {"avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512_bf16", "amx": "avx512_bf16"}

_AVX512 = ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "avx512": _AVX512,
    "avx512_bf16": _AVX512 + ("-mavx512bf16", "-mavx512vnni"),
}


def isa_flags(isa: str) -> tuple[str, ...]:
    """Compiler flags for a spec ISA."""
    if isa not in KERNEL_ISA:
        raise ValueError(f"isa: {isa!r} is not one of {ISAS}")
    return ISA_FLAGS[KERNEL_ISA[isa]]
