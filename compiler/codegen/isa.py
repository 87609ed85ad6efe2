"""Host ISA: detect it from /proc/cpuinfo and map it to compiler flags for the CPU expert kernel.

ISA names are the hardware spec's (avx2 / avx512 / avx512_bf16 / amx); the kernel template has
three code paths, so amx builds the avx512_bf16 variant (every AMX CPU has AVX512-BF16).
"""

from __future__ import annotations

from pathlib import Path

ISAS = ("avx2", "avx512", "avx512_bf16", "amx")

# Kernel variant (the template's `isa` constant) for each spec ISA.
KERNEL_ISA = {"avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512_bf16", "amx": "avx512_bf16"}

_AVX512 = ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
    "avx512": _AVX512,
    "avx512_bf16": _AVX512 + ("-mavx512bf16", "-mavx512vnni"),
}

# cpuinfo flags each ISA needs (kernel variants; checked from the richest down).
_REQUIRED = (
    ("amx", ("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx512_bf16", ("avx512_bf16", "avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx512", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx2", ("avx2", "fma", "f16c")),
)


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The `flags` set of the first processor in a cpuinfo file."""
    for line in Path(cpuinfo).read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    raise RuntimeError(f"{cpuinfo}: no 'flags' line")


def detect_isa(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The best ISA of ISAS this machine supports."""
    flags = cpu_flags(cpuinfo)
    for isa, needed in _REQUIRED:
        if all(f in flags for f in needed):
            return isa
    raise RuntimeError(f"this CPU has neither AVX2+FMA nor AVX-512 (flags: {' '.join(sorted(flags))})")


def isa_flags(isa: str) -> tuple[str, ...]:
    """Compiler flags for a spec ISA."""
    if isa not in KERNEL_ISA:
        raise ValueError(f"isa: {isa!r} is not one of {ISAS}")
    return ISA_FLAGS[KERNEL_ISA[isa]]
