"""The host ISAs Ostinato knows (the one list), and which of them this CPU has (/proc/cpuinfo).

Hardware specs name one of ISAS as `host.isa`. The CPU expert kernel template has a code path per
KERNEL_VARIANTS entry; `kernel_variant` maps a spec ISA to the path that serves it.

The runtime checks a plan's CPU kernel against it before loading the library: a kernel built for an
ISA the CPU lacks would die with SIGILL (even while loading, in its static initializers) instead of
saying what is wrong. The compiler uses the same detection to pick a host's ISA.

OSTINATO_ISA=<one of ISAS> caps what this CPU reports (detect_isa, supports) for the whole engine: a plan's
kernels, the dense products' bf16 slabs (model/bf16_widening.py NATIVE_BF16), every check gated on the ISA. It
runs an AVX2 host's code paths on an AVX-512 machine (the benchmarks' --isa; torch's own kernels need
ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA as well, bench/llama_cpp_side_by_side.py isa_env); it never
reports an ISA the CPU lacks.
"""

from __future__ import annotations

import os
from pathlib import Path

ISAS = ("avx2", "avx512", "avx512_bf16", "amx")

# The CPU kernel template's code paths; amx builds the avx512_bf16 one (every AMX CPU has AVX512-BF16).
KERNEL_VARIANTS = ("avx2", "avx512", "avx512_bf16")


def kernel_variant(isa: str) -> str:
    """The CPU kernel code path for a spec ISA."""
    if isa not in ISAS:
        raise ValueError(f"isa: {isa!r} is not one of {list(ISAS)}")
    return "avx512_bf16" if isa == "amx" else isa

# cpuinfo flags each ISA needs (checked from the richest down).
# avx512_bf16 needs AVX512_VBMI too (the dense ops' e4m3 byte lookups, vpermi2b): every CPU with both bf16 dot
# products and AMX has it (Zen 4 and later, Sapphire Rapids and later); one without it (Cooper Lake) runs avx512.
REQUIRED_FLAGS = (
    ("amx", ("amx_tile", "amx_bf16", "avx512_bf16", "avx512vbmi", "avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx512_bf16", ("avx512_bf16", "avx512vbmi", "avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx512", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("avx2", ("avx2", "fma", "f16c")),
)


ISA_ENV = "OSTINATO_ISA"


def isa_cap() -> str | None:
    """The ISA that OSTINATO_ISA caps this CPU's at, or None where it is unset."""
    value = os.environ.get(ISA_ENV, "")
    if not value:
        return None
    if value not in ISAS:
        raise ValueError(f"{ISA_ENV}={value!r} is not one of {list(ISAS)}")
    return value


def _within_cap(isa: str) -> bool:
    cap = isa_cap()
    return cap is None or ISAS.index(isa) <= ISAS.index(cap)


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The `flags` set of the first processor in a cpuinfo file."""
    for line in Path(cpuinfo).read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    raise RuntimeError(f"{cpuinfo}: no 'flags' line")


def supports(isa: str, cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether this CPU can run code built for `isa` (and OSTINATO_ISA lets it)."""
    needed = dict(REQUIRED_FLAGS)[isa]
    return set(needed) <= cpu_flags(cpuinfo) and _within_cap(isa)


def detect_isa(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The best ISA of ISAS this machine supports (at most OSTINATO_ISA's)."""
    flags = cpu_flags(cpuinfo)
    for isa, needed in REQUIRED_FLAGS:
        if all(f in flags for f in needed) and _within_cap(isa):
            return isa
    raise RuntimeError(f"this CPU has neither AVX2+FMA nor AVX-512 (flags: {' '.join(sorted(flags))})")
