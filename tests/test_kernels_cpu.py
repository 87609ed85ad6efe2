"""Generated CPU expert kernels (templates/cpu) against the float32 torch reference.

The kernel accumulates into out, so out is pre-filled with known random values and must end as
prefill + reference contribution; rows of tokens without routes must keep their prefill bit for bit.
Paths per expert with n routes: GEMV (n <= gemv_max), GEMM library (bf16, n >= gemm_min, when torch's
MKL is found), tiled; each is forced on here with small shapes through the build parameters.
"""

from __future__ import annotations

import pytest
import torch

from ostinato.checkpoint.formats import unpack_fp4_codes
from ostinato.compiler.codegen.kernels import CpuExpertParams, build_cpu_experts
from ostinato.isa import KERNEL_VARIANTS, detect_isa, supports
from ostinato.runtime.kernels.cpu_experts import CpuExpertKernel, gemm_library
from ostinato.runtime.kernels.reference import dequantize_expert, moe_experts_reference
from ostinato.runtime.kernels.routes import GroupedRoutes, group_routes
from ostinato.runtime.kernels.testing import random_packed_expert

pytestmark = pytest.mark.slow  # compiled kernels (C++)

HOST_ISA = detect_isa()
BF16_DOT = HOST_ISA in ("avx512_bf16", "amx")
# Stated bound for bf16 activations: builds without vdpbf16ps widen bf16 exactly and run the float32
# path (1e-5); avx512_bf16 builds run every path on bf16 dot products and round h to bf16 for the down
# matmul (2^-9 per element).
BF16_BOUND = 8e-3 if BF16_DOT else 1e-5
TINY, REAL = (256, 128), (4096, 2048)
# A build whose bf16 routes go to the GEMM library from 5 per expert (GEMV up to 4).
GEMM_BUILD = {"gemm_min_tokens": 5, "gemv_max_tokens": 4}
# Every code path of the template, each run where this CPU has its instructions (an AVX-512 host runs the
# avx2 build too): the ones it lacks are skipped, never emulated.
ISA_VARIANTS = [pytest.param(isa, marks=pytest.mark.skipif(not supports(isa), reason=f"this CPU ({HOST_ISA}) "
                                                                                       f"cannot run {isa}"))
                for isa in KERNEL_VARIANTS]


def bf16_bound(isa: str) -> float:
    """The stated bound for bf16 activations of a build for `isa` (BF16_BOUND's argument)."""
    return 8e-3 if isa == "avx512_bf16" else 1e-5
needs_gemm = pytest.mark.skipif(not BF16_DOT or gemm_library() is None,
                                reason=f"GEMM path: needs AVX512_BF16 (host: {HOST_ISA}) and torch's MKL symbols")
BUILDS = [pytest.param({}, id="own"), pytest.param(GEMM_BUILD, id="gemm", marks=needs_gemm)]


@pytest.fixture(scope="module")
def build_root(kernel_dir):
    return kernel_dir  # the session's kernel folder (tests/conftest.py)


@pytest.fixture(scope="module")
def kernel(build_root):
    cache = {}

    def get(D, I, isa=HOST_ISA, **kw):
        key = (D, I, isa, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = CpuExpertKernel(build_cpu_experts(CpuExpertParams(D=D, I=I, isa=isa, **kw),
                                                           root=build_root).path)
        return cache[key]
    return get


@pytest.fixture(scope="module")
def real_experts():
    g = torch.Generator().manual_seed(7)
    experts = [random_packed_expert(*REAL, g) for _ in range(8)]
    return experts, [dequantize_expert(e) for e in experts]


def _routes(T: int, E: int, k: int, g: torch.Generator, skip_last_token: bool = False) -> GroupedRoutes:
    k = min(k, E)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])  # [T, k]
    if skip_last_token and T > 1:
        ids[-1] = -1  # a token with no route: its out row must stay untouched
    return group_routes(ids, torch.rand(T, k, generator=g) + 0.1, E)


def _check(kern, x, routes, experts, dense=None, bound=1e-5, n_threads=2):
    T, D = x.shape
    prefill = torch.randn(T, D)
    out = prefill.clone()
    kern(x, routes, experts, out, n_threads)
    ref = moe_experts_reference(x.float(), routes, experts, torch.zeros(T, D), dense=dense)  # [T, D]
    assert torch.isfinite(out).all()
    err = ((out - prefill) - ref).abs().max() / ref.abs().max()
    assert err <= bound, f"relative error {err:.3g} > {bound}"
    untouched = torch.ones(T, dtype=torch.bool)
    untouched[routes.token] = False
    assert torch.equal(out[untouched], prefill[untouched])
    return out


@pytest.mark.parametrize("T", [1, 2, 7, 32, 128])
@pytest.mark.parametrize("E", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_shapes_match_reference(kernel, T, E, dtype):
    g = torch.Generator().manual_seed(1000 * T + E)
    experts = [random_packed_expert(*TINY, g) for _ in range(E)]
    x = torch.randn(T, TINY[0], generator=g).to(dtype)
    _check(kernel(*TINY), x, _routes(T, E, 2, g, skip_last_token=True), experts,
           bound=1e-5 if dtype == torch.float32 else BF16_BOUND)


@pytest.mark.parametrize("T,E,k", [(1, 1, 1), (1, 8, 6), (2, 3, 2), (7, 8, 6), (32, 8, 2), (128, 8, 2)])
def test_real_shape_matches_reference(kernel, real_experts, T, E, k):
    experts, dense = real_experts
    g = torch.Generator().manual_seed(T * 31 + E)
    x = torch.randn(T, REAL[0], generator=g)
    _check(kernel(*REAL), x, _routes(T, E, k, g), experts[:E], dense=dense[:E])


@pytest.mark.parametrize("T,k", [(1, 6), (3, 2), (32, 2)])  # GEMV with 1 and up to 3 tokens, tiled
def test_real_shape_bf16_activations(kernel, real_experts, T, k):
    experts, dense = real_experts
    g = torch.Generator().manual_seed(5 + T)
    x = torch.randn(T, REAL[0], generator=g).bfloat16()
    _check(kernel(*REAL), x, _routes(T, 8, k, g), experts, dense=dense, bound=BF16_BOUND)


@needs_gemm
@pytest.mark.parametrize("T", [7, 40])  # every expert gets T - 1 routes
def test_gemm_path_matches_reference(kernel, T):
    """bf16 routes through the GEMM library (forced on from 5 routes per expert) and, with the library
    unset (torch without MKL), through the kernel's own tiles: both match the reference."""
    g = torch.Generator().manual_seed(31 + T)
    experts = [random_packed_expert(*TINY, g) for _ in range(3)]
    x = torch.randn(T, TINY[0], generator=g).bfloat16()
    routes = _routes(T, 3, 3, g, skip_last_token=True)
    kern = kernel(*TINY, **GEMM_BUILD)
    outs = []
    try:
        for enabled in (True, False):
            assert kern.use_gemm(enabled) == enabled
            _check(kern, x, routes, experts, bound=BF16_BOUND)
            outs.append(kern(x, routes, experts, torch.zeros(T, TINY[0]), 2))
    finally:
        kern.use_gemm(True)
    assert not torch.equal(outs[0], outs[1])  # the library ran: its own summation order


def test_gemm_library_is_none_without_mkl_symbols(monkeypatch):
    """torch builds without MKL (aarch64, some distributions) export no cblas_gemm_bf16bf16f32: no library,
    and the kernel keeps its own tiles (test_gemm_path_matches_reference runs that fallback)."""
    from ostinato.runtime.kernels import cpu_experts

    monkeypatch.setattr(cpu_experts, "_GEMM_SYMBOLS", ("cblas_gemm_bf16bf16f32", "no_such_symbol"))
    assert cpu_experts.gemm_library.__wrapped__() is None


@needs_gemm
def test_gemm_path_at_real_shape(kernel, real_experts):
    experts, dense = real_experts
    g = torch.Generator().manual_seed(41)
    x = torch.randn(12, REAL[0], generator=g).bfloat16()
    _check(kernel(*REAL, **GEMM_BUILD), x, _routes(12, 3, 2, g), experts[:3], dense=dense[:3], bound=BF16_BOUND)


def test_float32_activations_never_take_the_gemm_path(kernel):
    """A float32 plan stays on exact float32 arithmetic: the same bits with and without the library."""
    g = torch.Generator().manual_seed(43)
    experts = [random_packed_expert(*TINY, g) for _ in range(2)]
    x = torch.randn(16, TINY[0], generator=g)
    routes = _routes(16, 2, 2, g)
    kern = kernel(*TINY, **GEMM_BUILD)
    _check(kern, x, routes, experts)
    outs = []
    try:
        for enabled in (True, False):
            kern.use_gemm(enabled)
            outs.append(kern(x, routes, experts, torch.zeros(16, TINY[0]), 2))
    finally:
        kern.use_gemm(True)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("T", [12, 24])  # 4 and 8 tokens per expert: gemv_chunk (scaled weights at 5..8)
def test_every_code_and_extreme_scales(kernel, T):
    """Each token goes to one expert whose scales sit near the ends of the e8m0 range (x compensates,
    so results stay finite and meaningful); groups with all-zero codes carry scale bytes 0 and 254."""
    g = torch.Generator().manual_seed(3)
    D, I = TINY
    # (gate/up scale bytes, down scale bytes, log2 of the activation scale)
    regimes = [((11, 17), (27, 33), 110), ((237, 243), (221, 227), -110), ((118, 124), (118, 124), 0)]
    experts = []
    for (lo, hi), (dlo, dhi), _ in regimes:
        e = random_packed_expert(D, I, g, lo, hi, dlo, dhi)
        for w, s in ((e.w1, e.w1_scale), (e.w2, e.w2_scale)):
            w[0, :16] = 0  # first group of row 0: all-zero codes, scale at the byte range's ends
            s.view(torch.uint8)[0, 0] = 0
            w[1, :16] = 0
            s.view(torch.uint8)[1, 0] = 254
        experts.append(e)
        codes = unpack_fp4_codes(e.w1)
        assert set(codes.unique().tolist()) == set(range(16))  # every FP4 code is exercised
    expert_of = torch.arange(T) % len(regimes)
    x = torch.randn(T, D, generator=g) * torch.tensor([2.0 ** r[2] for r in regimes])[expert_of, None]
    routes = group_routes(expert_of[:, None], torch.ones(T, 1), len(regimes))
    out = torch.zeros(T, D)
    kernel(D, I)(x, routes, experts, out, 2)
    ref = moe_experts_reference(x, routes, experts, torch.zeros(T, D))
    assert torch.isfinite(ref).all() and torch.isfinite(out).all()
    row_err = (out - ref).abs().amax(1) / ref.abs().amax(1)  # per token: rows differ by 2^200 in scale
    assert (ref.abs().amax(1) > 0).all()
    assert row_err.max() <= 1e-5, row_err


def _restrict_codes(w: torch.Tensor, scale: torch.Tensor, byte: int, keep: dict[int, int]) -> None:
    """In the groups of w [rows, K/2] whose scale byte [rows, K/32] is `byte`, replace FP4 codes by keep[code]."""
    lut = torch.arange(16, dtype=torch.uint8)
    for a, b in keep.items():
        lut[a] = b
    wb = w.view(torch.uint8)
    mask = (scale.view(torch.uint8) == byte).repeat_interleave(16, dim=1)  # [rows, K/2]: per byte
    mapped = lut[(wb & 15).long()] | (lut[(wb >> 4).long()] << 4)
    wb[mask] = mapped[mask]


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("T", [8, 20])  # 4 routes per expert (GEMV), 10 (tiles or the GEMM library)
def test_bf16_scales_at_the_low_end_of_the_range(kernel, build, T):
    """bf16 tiles scale by an exponent add for scale bytes 2..252 and by a float32 product outside it:
    gate/up groups with bytes 1 and 2 (x scaled by 2^110), codes kept where the product is a normal float32
    (no +-0.5 at byte 1), next to an expert of ordinary scales. (The top end cannot be checked through an
    expert: with x a normal bf16, weights near 2^126 saturate the SwiGLU.)"""
    g = torch.Generator().manual_seed(17)
    D, I = TINY
    regimes = [((1, 2), 110), ((118, 124), 0)]
    experts = []
    for (lo, hi), _ in regimes:
        e = random_packed_expert(D, I, g, lo, hi, 118, 124)
        for w, sc in ((e.w1, e.w1_scale), (e.w3, e.w3_scale)):
            _restrict_codes(w, sc, 1, {1: 2, 9: 10})
        experts.append(e)
    expert_of = torch.arange(T) % len(regimes)
    x = (torch.randn(T, D, generator=g) * torch.tensor([2.0 ** r[1] for r in regimes])[expert_of, None]).bfloat16()
    routes = group_routes(expert_of[:, None], torch.ones(T, 1), len(regimes))
    out = kernel(D, I, **build)(x, routes, experts, torch.zeros(T, D), 2)
    ref = moe_experts_reference(x.float(), routes, experts, torch.zeros(T, D))
    assert torch.isfinite(ref).all() and (ref.abs().amax(1) > 0).all()
    row_err = (out - ref).abs().amax(1) / ref.abs().amax(1)  # per token: the regimes differ by 2^-16 in scale
    assert row_err.max() <= BF16_BOUND, row_err


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 32])
def test_thread_count_does_not_change_results(kernel, T, dtype, build):
    g = torch.Generator().manual_seed(11)
    experts = [random_packed_expert(*TINY, g) for _ in range(4)]
    x = torch.randn(T, TINY[0], generator=g).to(dtype)
    routes = _routes(T, 4, 3, g)
    outs = []
    for n in (1, 2, 3):
        out = torch.zeros(T, TINY[0])
        kernel(*TINY, **build)(x, routes, experts, out, n)
        outs.append(out)
    assert torch.equal(outs[1], outs[2])
    if build:  # MKL (no CNR mode) sums differently outside a parallel region: float32 rounding apart
        assert (outs[0] - outs[1]).abs().max() <= 1e-6 * outs[1].abs().max()
    else:
        assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gemv_items_size_changes_no_result(kernel, dtype):
    """A decode call (every expert on the GEMV path) split into items of 16 rows (row_tile: the items before
    gemv_row_tile), 64 (the default) or 128 gives the same out bit for bit, on the reference within the bound;
    a call with a tiled expert (T 32) keeps row_tile's items whatever gemv_row_tile says."""
    g = torch.Generator().manual_seed(13)
    experts = [random_packed_expert(*TINY, g) for _ in range(4)]
    for T, routes in ((1, _routes(1, 4, 3, g)), (3, _routes(3, 4, 3, g)), (32, _routes(32, 4, 3, g))):
        x = torch.randn(T, TINY[0], generator=g).to(dtype)
        for rows in (16, 64, 128):  # each within the stated bound of the float32 reference
            _check(kernel(*TINY, gemv_row_tile=rows), x, routes, experts,
                   bound=1e-5 if dtype == torch.float32 else BF16_BOUND)
        exact = []
        for rows in (16, 64, 128):
            out = torch.zeros(T, TINY[0])
            kernel(*TINY, gemv_row_tile=rows)(x, routes, experts, out, 2)
            exact.append(out)
        assert all(torch.equal(o, exact[0]) for o in exact[1:]), T
    with pytest.raises(ValueError, match="gemv_row_tile"):
        CpuExpertParams(D=256, I=128, gemv_row_tile=96)  # does not divide I


@pytest.mark.parametrize("isa", ISA_VARIANTS)
@pytest.mark.parametrize("T", [4, 8])  # gemv_chunk: 1..4 tokens, and 5..8 (scaled weights)
def test_gemv_and_tiled_paths_agree(kernel, isa, T):
    """The same routes through a build that decodes into registers (gemv_max_tokens=8) and one that
    always tiles (gemv_max_tokens=1) agree to float32 rounding."""
    g = torch.Generator().manual_seed(12)
    experts = [random_packed_expert(*TINY, g) for _ in range(2)]
    x = torch.randn(T, TINY[0], generator=g)
    routes = group_routes(torch.tensor([[0, 1]] * T), torch.ones(T, 2), 2)  # T tokens per expert
    a, b = torch.zeros(T, TINY[0]), torch.zeros(T, TINY[0])
    kernel(*TINY, isa=isa, gemv_max_tokens=8)(x, routes, experts, a, 2)
    kernel(*TINY, isa=isa, gemv_max_tokens=1)(x, routes, experts, b, 2)
    assert not torch.equal(a, torch.zeros_like(a))
    assert ((a - b).abs().max() / a.abs().max()) <= 1e-6


def _routes_per_expert(counts: list[int], g: torch.Generator) -> GroupedRoutes:
    """Routes giving expert e exactly counts[e] tokens (tokens 0 .. counts[e] - 1), random weights."""
    T = max(counts)
    ids = torch.tensor([[e if t < n else -1 for e, n in enumerate(counts)] for t in range(T)])  # [T, E]
    return group_routes(ids, torch.rand(T, len(counts), generator=g) + 0.1, len(counts))


@pytest.mark.parametrize("isa", ISA_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wide_gemv_matches_reference(kernel, real_experts, isa, dtype):
    """Experts with 1 and 5..8 routes in one decode call, all on the GEMV path (gemv_max_tokens=8: the
    wide row kernels for 5..8), at V4-Flash's shape: the float32 reference within each build's bound."""
    experts, dense = real_experts
    g = torch.Generator().manual_seed(23)
    counts = [1, 5, 6, 7, 8]
    kern = kernel(*REAL, isa=isa, gemv_max_tokens=8)
    assert kern.info["gemv_max"] == "8" and kern.info["isa"] == isa
    x = torch.randn(max(counts), REAL[0], generator=g).to(dtype)
    _check(kern, x, _routes_per_expert(counts, g), experts[:5], dense=dense[:5],
           bound=1e-5 if dtype == torch.float32 else bf16_bound(isa))


@pytest.mark.parametrize("isa", ISA_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_gemv_width_on_every_isa(kernel, isa, dtype):
    """Each token count 1..8 of the GEMV path (one expert per count), tiny shape, the default build of each
    ISA the CPU runs: the float32 reference within the bound; tokens without routes keep their out rows."""
    g = torch.Generator().manual_seed(29)
    counts = list(range(1, 9))
    experts = [random_packed_expert(*TINY, g) for _ in counts]
    x = torch.randn(9, TINY[0], generator=g).to(dtype)  # token 8 has no route
    _check(kernel(*TINY, isa=isa), x, _routes_per_expert(counts, g), experts,
           bound=1e-5 if dtype == torch.float32 else bf16_bound(isa))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_odd_block_counts_end_in_a_lone_block(kernel, dtype):
    """bf16 operands take blocks of 64 inputs in pairs (bf16dot.h): D 192 and I 320 (3 and 5 blocks) end every
    row in a lone block, on the GEMV path (1, 3 and 8 routes an expert) and the tiled one (12): the float32
    reference within the bound."""
    g = torch.Generator().manual_seed(37)
    D, I = 192, 320
    counts = [1, 3, 8, 12]
    experts = [random_packed_expert(D, I, g) for _ in counts]
    x = torch.randn(max(counts) + 1, D, generator=g).to(dtype)  # the last token has no route
    _check(kernel(D, I, k_chunk=64), x, _routes_per_expert(counts, g), experts,
           bound=1e-5 if dtype == torch.float32 else BF16_BOUND)


def test_bf16_gemv_takes_scale_bytes_0_and_255_exactly(kernel):
    """The bf16 GEMV builds group scales from their bytes as float32 bits b << 23, exact for bytes 1..254;
    rows with byte 0 (2^-127, a subnormal) or 255 (NaN) take a table. Gate/up groups of bytes 0 and 1 with
    every code (x scaled by 2^120 so their products count) match the reference; a down group of byte 255
    makes its output column NaN for every token, as in the reference (b << 23 would read it as infinity)."""
    g = torch.Generator().manual_seed(41)
    D, I = TINY
    T = 4  # one expert, 4 routes: the GEMV path
    e = random_packed_expert(D, I, g, 0, 1, 118, 124)
    assert set(e.w1_scale.view(torch.uint8).unique().tolist()) == {0, 1}
    x = (torch.randn(T, D, generator=g) * 2.0 ** 120).bfloat16()
    routes = group_routes(torch.zeros(T, 1, dtype=torch.long), torch.ones(T, 1), 1)
    _check(kernel(D, I), x, routes, [e], bound=BF16_BOUND)
    e.w2_scale.view(torch.uint8)[5, 2] = 255
    out = kernel(D, I)(x, routes, [e], torch.zeros(T, D), 2)
    ref = moe_experts_reference(x.float(), routes, [e], torch.zeros(T, D))
    nan = torch.zeros(D, dtype=torch.bool)
    nan[5] = True
    assert ref[:, nan].isnan().all() and out[:, nan].isnan().all()
    assert ref[:, ~nan].isfinite().all() and out[:, ~nan].isfinite().all()


@pytest.mark.parametrize("isa", ISA_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_chunks_and_row_groups_at_real_shape(kernel, real_experts, isa, dtype):
    """Each token count 1..8 of the GEMV path at V4-Flash's shape, where from 2 tokens (float32 inputs) or 3
    (bf16 on vdpbf16ps) gemv_rows cuts every row into chunks of inputs (the last one shorter) and passes a group
    of 16 rows over each chunk: with items of 64 rows (8 groups of gate or up rows), 16 and 4 (part groups: 8
    gate and up rows, 4 down rows) the float32 reference within the bound; 64 and 16 give the same out bit for
    bit (chunks and groups change no sum's order; items under VW rows take SwiGLU's scalar exp, not the vector
    one, so 4 differs from them in rounding)."""
    experts, dense = real_experts
    g = torch.Generator().manual_seed(31)
    counts = list(range(1, 9))
    x = torch.randn(9, REAL[0], generator=g).to(dtype)  # token 8 has no route
    routes = _routes_per_expert(counts, g)
    bound = 1e-5 if dtype == torch.float32 else bf16_bound(isa)
    exact = []
    for rows in (64, 16, 4):
        kern = kernel(*REAL, isa=isa, gemv_row_tile=rows)
        _check(kern, x, routes, experts, dense=dense, bound=bound)
        exact.append(kern(x, routes, experts, torch.zeros(9, REAL[0]), 2))
    assert torch.equal(exact[0], exact[1])


@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512_bf16"])
def test_the_built_kernel_keeps_its_prefetches(build_root, isa):
    """The GEMV and the bf16 tiles prefetch the weights they read next. A prefetch has no visible effect, so GCC
    deletes the calls of a prefetch helper it leaves out of line (it did: every prefetch of a build gone, the
    GEMV 30-40% slower at 4-8 tokens): the helpers are always inlined, and each ISA's build at V4-Flash's shape
    holds prefetch instructions."""
    import shutil
    import subprocess

    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump to disassemble the kernel")
    record = build_cpu_experts(CpuExpertParams(D=REAL[0], I=REAL[1], isa=isa), root=build_root)
    code = subprocess.run([objdump, "-d", "--no-show-raw-insn", record.path], capture_output=True, text=True,
                          check=True).stdout
    assert code.count("prefetcht1") >= 8, f"{record.path}: {code.count('prefetcht1')} prefetcht1 instructions"


def test_invalid_routes_are_rejected_before_writing(kernel):
    g = torch.Generator().manual_seed(13)
    experts = [random_packed_expert(*TINY, g)]
    x = torch.randn(2, TINY[0])
    bad = GroupedRoutes(torch.tensor([0, 2]), torch.tensor([0, 5]), torch.ones(2))  # token 5 of 2
    out = torch.full((2, TINY[0]), 3.0)
    with pytest.raises(ValueError, match="token is out of range"):
        kernel(*TINY)(x, bad, experts, out, 2)
    assert (out == 3.0).all()
    with pytest.raises(ValueError, match="x: need"):
        kernel(*TINY)(torch.randn(2, 128), bad, experts, out, 2)


def test_empty_routes_leave_out_untouched(kernel):
    experts = [random_packed_expert(*TINY, torch.Generator().manual_seed(1))]
    out = torch.full((3, TINY[0]), 2.0)
    kernel(*TINY)(torch.randn(3, TINY[0]), group_routes(torch.full((3, 1), -1), torch.ones(3, 1), 1), experts, out)
    assert (out == 2.0).all()


@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512_bf16"])
def test_every_isa_variant_compiles(build_root, isa):
    """All variants build here; each runs only where the CPU has its instructions."""
    record = build_cpu_experts(CpuExpertParams(D=256, I=128, isa=isa), root=build_root)
    assert record.path.endswith(".so") and record.params["isa"] == isa
    order = ["avx2", "avx512", "avx512_bf16", "amx"]
    if order.index(isa) > order.index(HOST_ISA):
        pytest.skip(f"this CPU ({HOST_ISA}) cannot run the {isa} variant")
    kern = CpuExpertKernel(record.path)
    assert kern.info["isa"] == isa
    g = torch.Generator().manual_seed(21)
    experts = [random_packed_expert(256, 128, g) for _ in range(3)]
    for T in (2, 12):  # GEMV, tiles
        x, routes = torch.randn(T, 256, generator=g), _routes(T, 3, 2, g)
        _check(kern, x, routes, experts)
        _check(kern, x.bfloat16(), routes, experts, bound=8e-3 if isa == "avx512_bf16" else 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5])
def test_cold_task_of_a_step_computes_only_the_cold_routes(kernel, dtype, T):
    """ost_cold_task_run (a step graph's host node; called directly without CUDA) over T tokens' k routes
    of which some are hot: its out equals the reference over the cold ones and is fully overwritten."""
    from ostinato.runtime.kernels.cold_task import ColdBridge, ColdStaging

    D, I = TINY
    kern = kernel(D, I)
    g = torch.Generator().manual_seed(11)
    E, k, cold = 16, 6, [1, 3, 4, 8, 9, 12, 15]
    experts = [random_packed_expert(D, I, g) for _ in cold]
    cold_of = torch.full((E,), -1, dtype=torch.int64)
    cold_of[cold] = torch.arange(len(cold))
    staging = ColdStaging(D, k, [1, 8], dtype, torch.device("cpu"))
    bridge = ColdBridge(kern, kern.table(experts), cold_of, staging, n_threads=2)
    hot = torch.tensor([0, 2, 5, 6, 7, 10])
    trials = [torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) for _ in range(4)]
    trials.append(hot.expand(T, k))  # last: all hot
    for ids in trials:  # [T, k]
        w, x = torch.rand(T, k, generator=g), torch.randn(T, D, generator=g).to(dtype)
        staging.out.fill_(float("nan"))  # poisoned: every element must be written
        bridge.start(x, ids, w)
        bridge.check()
        got = bridge.finish(T)
        ref = moe_experts_reference(x.float(), group_routes(cold_of[ids], w, len(cold)), experts,
                                    torch.zeros(T, D))
        assert torch.isfinite(got).all()
        bound = 1e-5 if dtype == torch.float32 else BF16_BOUND  # bf16: h rounded to bf16 (vdpbf16ps builds)
        assert (got - ref).abs().max() <= bound * ref.abs().max().clamp(min=1e-30), ids
    assert not got.any()  # no cold route: zeros
