"""The host ISAs Ostinato knows (the one list), and which of them this CPU has (/proc/cpuinfo).

Hardware specs name one of ISAS as `host.isa`. The CPU expert kernel template has a code path per
KERNEL_VARIANTS entry; `kernel_variant` maps a spec ISA to the path that serves it.

The runtime checks a plan's CPU kernel against it before loading the library: a kernel built for an
ISA the CPU lacks would die with SIGILL (even while loading, in its static initializers) instead of
saying what is wrong. The compiler uses the same detection to pick a host's ISA.
"""

from __future__ import annotations

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


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The `flags` set of the first processor in a cpuinfo file."""
    for line in Path(cpuinfo).read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    raise RuntimeError(f"{cpuinfo}: no 'flags' line")


def supports(isa: str, cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether this CPU can run code built for `isa`."""
    needed = dict(REQUIRED_FLAGS)[isa]
    return set(needed) <= cpu_flags(cpuinfo)


def detect_isa(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The best ISA of ISAS this machine supports."""
    flags = cpu_flags(cpuinfo)
    for isa, needed in REQUIRED_FLAGS:
        if all(f in flags for f in needed):
            return isa
    raise RuntimeError(f"this CPU has neither AVX2+FMA nor AVX-512 (flags: {' '.join(sorted(flags))})")
