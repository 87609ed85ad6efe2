"""The expert kernels a plan needs: validated parameters, then render (+ compile for the CPU).

Each builder returns a KernelRecord for the plan's `kernels` section.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ostinato.isa import ISAS, detect_isa, kernel_variant

from .cxx import BASE_FLAGS, compile_shared
from .isa import isa_flags
from .render import KernelRecord, render

CPU_TEMPLATE = "cpu/moe_experts.cpp.j2"
TRITON_TEMPLATE = "triton/moe_experts.py.j2"


def _check(cond: bool, name: str, value, allowed: str) -> None:
    if not cond:
        raise ValueError(f"{name}: {value!r} is invalid; allowed: {allowed}")


@dataclass(frozen=True)
class CpuExpertParams:
    D: int
    I: int
    isa: str = "avx2"
    row_tile: int = 16          # output rows per work item
    # output rows per work item when every expert of a call takes the GEMV path (decode: up to gemv_max_tokens
    # routes an expert); no tile to fit in a cache there, so fewer, longer items (schedule.h). Measured on a
    # 2-core Zen 4, 2026-12-03, plans alternating in one process, a layer's call of 6 random experts of one
    # token: V4-Flash's shape in bf16, ms a call, tiles of 16 / 32 / 64 / 128 rows 3.74 / 3.38 / 3.23 / 3.24
    # (avx512_bf16), avx2 build 5.17 against 4.61 at 64; the real-vocab preset's (D 256, I 128) in float32
    # 44.8 against 42.6 us
    gemv_row_tile: int = 64
    k_chunk: int = 128          # batched path: 2 x row_tile x k_chunk float32 tile = 16 KiB (L1)
    # up to this many routes per expert decode straight into registers (1..8): weights read once, no tile
    # written and re-read. Measured on a 2-core Zen 4, 2026-12-05 (a busy machine: 1 thread, builds
    # alternating in one process, per call CPU seconds), GB/s of expert bytes per CPU second over calls to
    # 48 random experts, top-6, bf16 activations, 8 against 4: avx2 3.96 / 3.51 at 3 tokens per expert,
    # 2.15 / 1.90 at 6; avx512_bf16 7.05 / 6.76 at 3, 4.06 / 4.19 at 6 (equal within the noise)
    gemv_max_tokens: int = 8
    # bf16 activations: from this many routes per expert, bf16 tiles go to a GEMM library (MKL from torch;
    # 0: never). The crossover is measured by bench/cpu_experts.py (its (d) line). 0 is what it found
    # on a 2-core Zen 4 EPYC: MKL's bf16 GEMM was 3-5x slower than the kernel's own tiles at every count
    # 2..64 (MKL takes no AVX512_BF16 path on AMD); a host where it finds a crossover (AMX) sets it here.
    gemm_min_tokens: int = 0
    bf16_k_chunk: int = 4096    # bf16 tiles: 2 x row_tile x bf16_k_chunk bf16 = 256 KiB (L2); measured on Zen 4:
                                # full K beat 1024 and 2048 by 10-20% at 8-16 tokens per expert, equal at 64
    max_experts: int = 256
    swiglu_limit: float = 10.0

    def __post_init__(self):
        _check(self.D > 0 and self.D % 64 == 0, "D", self.D, "a positive multiple of 64")
        _check(self.I > 0 and self.I % 64 == 0, "I", self.I, "a positive multiple of 64")
        _check(self.isa in ISAS, "isa", self.isa, str(ISAS))
        _check(self.row_tile % 4 == 0 and self.D % self.row_tile == 0 and self.I % self.row_tile == 0,
               "row_tile", self.row_tile, "a multiple of 4 dividing D and I")
        _check(self.gemv_row_tile % 4 == 0 and self.D % self.gemv_row_tile == 0 and self.I % self.gemv_row_tile == 0,
               "gemv_row_tile", self.gemv_row_tile, "a multiple of 4 dividing D and I")
        _check(self.k_chunk % 64 == 0 and self.D % self.k_chunk == 0 and self.I % self.k_chunk == 0,
               "k_chunk", self.k_chunk, "a multiple of 64 dividing D and I")
        _check(1 <= self.gemv_max_tokens <= 8, "gemv_max_tokens", self.gemv_max_tokens, "1..8")
        _check(self.gemm_min_tokens == 0 or self.gemm_min_tokens > self.gemv_max_tokens, "gemm_min_tokens",
               self.gemm_min_tokens, "0 (never) or more than gemv_max_tokens")
        _check(self.bf16_k_chunk % 64 == 0 and all(k % self.bf16_k_chunk == 0 or k < self.bf16_k_chunk
                                                   for k in (self.D, self.I)),
               "bf16_k_chunk", self.bf16_k_chunk, "a multiple of 64 dividing D and I (or larger)")
        # bf16 dot-product builds decode 64-input blocks in pairs from the start of each K chunk (bf16dot.h)
        _check(kernel_variant(self.isa) != "avx512_bf16" or self.bf16_k_chunk % 128 == 0
               or (self.D <= self.bf16_k_chunk and self.I <= self.bf16_k_chunk), "bf16_k_chunk", self.bf16_k_chunk,
               "a multiple of 128 where it is shorter than D or I (bf16 builds pair 64-input blocks)")
        _check(self.max_experts >= 1, "max_experts", self.max_experts, ">= 1")
        _check(isinstance(self.swiglu_limit, float) and self.swiglu_limit > 0, "swiglu_limit", self.swiglu_limit,
               "a positive float")

    def template_params(self) -> dict:
        return asdict(self) | {"isa": kernel_variant(self.isa)}


def build_cpu_experts(params: CpuExpertParams, root: str | Path | None = None) -> KernelRecord:
    """Render and compile the CPU expert kernel; the record's path is the shared library."""
    flags = (*BASE_FLAGS, *isa_flags(params.isa))  # hashed with the source: new flags, new artifact
    return compile_shared(render(CPU_TEMPLATE, params.template_params(), flags=flags, root=root))


def host_cpu_params(D: int, I: int, **kw) -> CpuExpertParams:
    """Parameters for this machine's ISA."""
    return CpuExpertParams(D=D, I=I, isa=detect_isa(), **kw)


@dataclass(frozen=True)
class TritonExpertParams:
    D: int
    I: int
    variant: str                # "prefill" (routes grouped by expert) or "decode" (fixed, masked routes)
    block_m: int = 16           # prefill: routes per program (tl.dot needs >= 16)
    block_n: int = 64           # output rows per program
    block_k: int = 64           # contraction step (a multiple of the 32-input MXFP4 group)
    max_routes: int = 0         # decode: fixed route count the CUDA graph captures
    swiglu_limit: float = 10.0
    # prefill dots on float32 operands: "ieee" float32 FMAs (exact, no tensor cores); "tf32x3" tensor
    # cores at about 22 bits (the weights are exact in tf32, the input is split in two); "tf32" 11 bits
    dot_precision: str = "ieee"

    def __post_init__(self):
        _check(self.variant in ("prefill", "decode"), "variant", self.variant, "prefill, decode")
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            _check(v >= 16 and v & (v - 1) == 0, name, v, "a power of two >= 16")
        _check(self.block_k % 32 == 0, "block_k", self.block_k, "a multiple of 32")
        _check(self.D % self.block_k == 0 and self.I % self.block_k == 0, "block_k", self.block_k, "divides D and I")
        _check(self.D % self.block_n == 0 and self.I % self.block_n == 0, "block_n", self.block_n, "divides D and I")
        _check((self.max_routes > 0) == (self.variant == "decode"), "max_routes", self.max_routes,
               "> 0 for decode, 0 for prefill")
        _check(self.dot_precision in ("ieee", "tf32x3", "tf32"), "dot_precision", self.dot_precision,
               "ieee, tf32x3, tf32")
        _check(isinstance(self.swiglu_limit, float) and self.swiglu_limit > 0, "swiglu_limit", self.swiglu_limit,
               "a positive float")


def render_triton_experts(params: TritonExpertParams, root: str | Path | None = None) -> KernelRecord:
    """Render the Triton expert module; the record's path is the .py file."""
    return render(TRITON_TEMPLATE, asdict(params), root=root)
