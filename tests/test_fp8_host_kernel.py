"""The host FP8 kernel (`ost_fp8_linear`, templates/cpu/dense_ops.cpp.j2): a checkpoint FP8 matrix as stored
times up to 4 tokens, against the float32 product of the dequantized matrix, on fresh random inputs; every
e4m3 code and scale decoded exactly; the way model/fp8_matrix.py chooses it (a plan's forward, a few tokens)
or dequantizes a slab of rows at a time (more tokens, or no plan), both against the same reference. Every
test runs on each ISA code path this CPU has (AVX2; AVX-512's 16-float vectors; AVX512_BF16, whose build takes a
bf16 plan's bf16 x on vdpbf16ps: the tests give x in bf16 too, and on the other paths the library widens it).
Legend: G groups, T tokens, N = G M output rows, K inputs."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
from ostinato.compiler.codegen.dense_ops import build_cpu_dense_ops
from ostinato.isa import supports
from ostinato.runtime.engine.op_count import OpCounter
from ostinato.runtime.kernels.dense_ops import DenseOpsKernel
from ostinato.runtime.model import fp8_matrix, fused
from ostinato.runtime.model.fp8_matrix import Fp8Matrix, grouped_linear, linear

pytestmark = pytest.mark.slow  # compiles the host library (C++)

REL = 2e-6  # float32 sums of the same exact products in another order


@pytest.fixture(scope="module")
def kernels(kernel_dir, host_isa):
    return DenseOpsKernel(build_cpu_dense_ops(kernel_dir, isa=host_isa).path, None)


def _matrix(n: int, k: int, gen: torch.Generator) -> Fp8Matrix:
    """Rows of very different sizes (block scales far apart), some weights in e4m3's subnormal range."""
    pad_n, pad_k = -(-n // 128) * 128, -(-k // 128) * 128
    w = torch.randn(pad_n, pad_k, generator=gen) * torch.logspace(-4, 2, pad_n)[:, None]
    q, s = quantize_fp8(w)
    return Fp8Matrix.of_bytes(q[:n, :k].contiguous(), s)


class _MatmulDtypes(TorchDispatchMode):
    """The dtypes of the operands of every aten.mm dispatched inside (the slabs' products)."""

    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.mm:
            self.dtypes |= {args[0].dtype, args[1].dtype}
        return func(*args, **(kwargs or {}))


def _reference(x: torch.Tensor, m: Fp8Matrix) -> torch.Tensor:
    """x [G, T, K] float32 @ dequantized W [G*M, K]^T by groups -> [G, T, M], in float64."""
    w = dequantize_fp8(m.q, m.scale).double()
    G = x.shape[0]
    return torch.bmm(x.double(), w.view(G, -1, w.shape[1]).transpose(1, 2))


def _close(got: torch.Tensor, want: torch.Tensor, rel: float = REL) -> None:
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err <= rel, f"{err:.2e} of the product's scale"


@pytest.mark.parametrize("G,T,N,K", [(1, 1, 256, 4096), (1, 2, 384, 1024), (1, 3, 300, 136), (1, 4, 130, 264),
                                     (4, 1, 512, 256), (8, 2, 1024, 512), (2, 4, 200, 152), (1, 1, 302, 264),
                                     (2, 1, 202, 136), (3, 2, 390, 8), (1, 3, 256, 64), (2, 2, 256, 192),
                                     (1, 1, 262, 8192), (2, 2, 260, 6144), (1, 3, 132, 6208)])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_equals_the_dequantized_product(kernels, G, T, N, K, x_dtype):
    """K = 0, 8, 16 and 24 mod 32 (the kernel's tails) and K < 32, N cutting a scale block, groups cutting one
    too and rows that do not fill the kernel's groups of 4 (one token) or 2 (two); bf16 x at K a multiple of 64
    (the vdpbf16ps path where the build has it: K = 64 and 192 end in half a scale block; from K 6,144 its rows
    share x's loads, 6,208 ending in half a block) and not (widened)."""
    g = torch.Generator().manual_seed(N * K + T)
    m = _matrix(N, K, g)
    x = (torch.randn(G, T, K, generator=g) * 4).to(x_dtype)
    assert kernels.takes_fp8(x, m.q, m.scale, G)
    with OpCounter() as ops:
        got = kernels.fp8_linear(x, m.q, m.scale, G)
    assert ops.ops == 1 and got.shape == (G, T, N // G) and got.dtype == torch.float32
    _close(got, _reference(x.float(), m))


@pytest.mark.parametrize("T", [1, 2, 3])
def test_rows_sharing_x_on_the_bf16_path_change_no_output(kernels, host_isa, kernel_dir, T):
    """Builds with 1, 3 or 8 rows sharing each load of a bf16 x give the plan build's products bit for bit, at a
    K where rows are grouped (8,192; 131 rows a group leave remainders) and one where they are not."""
    if host_isa != "avx512_bf16":
        pytest.skip("the rows sharing x are the vdpbf16ps path's (avx512_bf16 builds)")
    g = torch.Generator().manual_seed(T)
    for N, K in ((262, 8192), (262, 4096)):
        m = _matrix(N, K, g)
        x = (torch.randn(2, T, K, generator=g) * 4).bfloat16()
        want = kernels.fp8_linear(x, m.q, m.scale, 2)
        for rows in (1, 3, 8):
            other = DenseOpsKernel(build_cpu_dense_ops(kernel_dir, isa=host_isa, fp8_bf16_rows=rows).path, None)
            assert torch.equal(other.fp8_linear(x, m.q, m.scale, 2), want), (N, K, rows)
        _close(want, _reference(x.float(), m))


def test_the_bf16_dot_path_is_built_where_the_isa_has_it(kernels, host_isa):
    assert kernels.fp8_bf16_dot == (host_isa == "avx512_bf16")


def test_a_library_built_before_the_bf16_path_widens_bf16_x(tmp_path):
    """A plan compiled before ost_fp8_linear_bf16 existed keeps its library: loading it must not fail, and its
    bf16 x goes to ost_fp8_linear as float32 (here a stand-in library with the older symbols only, whose
    product records the x it was given)."""
    import subprocess

    from ostinato.compiler.codegen.cxx import compiler

    src = tmp_path / "older.cpp"
    src.write_text("""#include <stdint.h>
extern "C" {
int ost_rms_norm(void) { return 0; }
int ost_rope(void) { return 0; }
int ost_head_logits(void) { return 0; }
int ost_fp8_dequantize(void) { return 0; }
int ost_fp8_linear(const float* x, const uint8_t* W, const uint8_t* s, int64_t ss, float* out, int64_t G, int64_t T,
                   int64_t M, int64_t K, int n) { for (int64_t i = 0; i < G * T * M; ++i) out[i] = x[0]; return 0; }
}
""")
    subprocess.run([compiler(), "-shared", "-fPIC", str(src), "-o", str(tmp_path / "libolder.so")], check=True)
    older = DenseOpsKernel(tmp_path / "libolder.so", None)
    assert not older.fp8_bf16_dot
    x = torch.full((1, 1, 128), 1.5, dtype=torch.bfloat16)
    m = _matrix(128, 128, torch.Generator().manual_seed(1))
    assert torch.equal(older.fp8_linear_impl(x, m.q, m.scale, 1), torch.full((1, 1, 128), 1.5))


def test_every_code_and_scale_decodes_exactly(kernels):
    """Row r holds all 254 finite e4m3 codes (and two zeros), subnormals among them, under block scales
    2^-60 and 2^60; x = one-hot columns, so each output is one weight, which must be the dequantized one."""
    finite = [c for c in range(256) if c & 0x7F != 0x7F]  # 0x7F / 0xFF are NaN
    codes = torch.tensor(finite + [0, 0], dtype=torch.uint8).repeat(128, 1)  # [128, 256]
    q = codes.view(torch.float8_e4m3fn)
    scale = torch.tensor([[67, 187]], dtype=torch.uint8)
    m = Fp8Matrix.of_bytes(q, scale)
    want = dequantize_fp8(q, scale.view(torch.float8_e8m0fnu))  # [128, 256]
    for cols in range(0, 256, 4):  # 4 tokens a call, each one-hot on a column
        x = torch.zeros(1, 4, 256)
        x[0, torch.arange(4), torch.arange(cols, cols + 4)] = 1.0
        for xk in (x, x.bfloat16()):  # float32 x widens the weights, bf16 x (K = 256) looks them up as bf16
            got = kernels.fp8_linear(xk, m.q, m.scale, 1)[0]  # [4, 128]
            assert torch.equal(got, want[:, cols:cols + 4].T)


@pytest.mark.parametrize("size", [2.0 ** 7, 1e3, 2.0 ** 121])
@pytest.mark.parametrize("T,K", [(1, 4096), (2, 264)])
def test_large_activations_keep_exact_products(kernels, size, T, K):
    """The kernel scales x by a power of two once a call to match its decoding (2^8 for F16C's halves, 2^120 for
    AVX2's float32 bits): where x is large (activations of 10^3 and more occur; 2^121 with weights near 2^-60
    keeps every product finite) the scale is lowered so none overflows, and the sums are scaled back: the outputs
    stay the float32 product's."""
    g = torch.Generator().manual_seed(int(size) % 1000 + T)
    q, scale = quantize_fp8(torch.randn(128, -(-K // 128) * 128, generator=g) * (2.0 ** -60 if size > 2 ** 100 else 1))
    m = Fp8Matrix.of_bytes(q[:, :K].contiguous(), scale)
    x = torch.randn(1, T, K, generator=g)
    x[0, :, ::7] *= size  # every 7th column large
    want = _reference(x, m)
    assert want.abs().max() < 2.0 ** 100  # the float32 product is finite
    _close(kernels.fp8_linear(x, m.q, m.scale, 1), want)


def test_what_the_kernel_does_not_take_is_refused_or_left_to_the_caller(kernels):
    g = torch.Generator().manual_seed(5)
    m = _matrix(256, 256, g)
    x = torch.randn(1, 1, 256, generator=g)
    assert not kernels.takes_fp8(torch.randn(1, 5, 256), m.q, m.scale, 1)  # more than 4 tokens
    assert not kernels.takes_fp8(x.half(), m.q, m.scale, 1)  # float32 or a bf16 plan's bf16 only
    assert not kernels.takes_fp8(x, m.q, m.scale, 3)  # groups of whole rows only
    assert not kernels.takes_fp8(torch.randn(1, 1, 252), _matrix(256, 252, g).q, m.scale, 1)  # K % 8
    with pytest.raises(ValueError, match="ost_fp8_linear rejected"):
        kernels.fp8_linear_impl(torch.randn(1, 5, 256), m.q, m.scale, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 4, 5, 40])
@pytest.mark.parametrize("with_plan", [True, False])
@pytest.mark.parametrize("native_bf16", [True, False])
def test_the_model_takes_the_kernel_for_a_few_tokens_in_a_plans_forward(kernels, dtype, T, with_plan, native_bf16,
                                                                         monkeypatch):
    """A plan's forward at up to 4 tokens: one op; else W dequantized a slab of rows at a time (1,000 rows
    of K 1,152 span slabs of 896: to float32, or to bf16 for torch's bf16 GEMM where a bf16 x meets a host
    with bf16 arithmetic, set here both ways); either way the float32 product rounded once to x's dtype."""
    monkeypatch.setattr(fp8_matrix, "NATIVE_BF16", native_bf16)
    g = torch.Generator().manual_seed(T)
    m = _matrix(1000, 1152, g)
    x = (torch.randn(T, 1152, generator=g)).to(dtype)
    xg = (torch.randn(4, T, 1152, generator=g)).to(dtype)  # 4 groups of 250 rows
    with fused.using(kernels if with_plan else None), OpCounter() as ops, _MatmulDtypes() as mm:
        got = linear(x, m), grouped_linear(xg, m)
    if with_plan and T <= 4:
        assert sum(n for op, n in ops.by_op.items() if "fp8_linear" in op) == 2
    else:
        assert not any("fp8_linear" in op for op in ops.by_op)
        in_bf16 = native_bf16 and dtype == torch.bfloat16  # the slabs' products in bf16, else float32
        assert mm.dtypes == {torch.bfloat16 if in_bf16 else torch.float32}
    rel = REL if dtype == torch.float32 else 2 ** -8  # bf16: one rounding of the float32 sum
    for out, want in ((got[0], _reference(x.float()[None], m)[0]), (got[1], _reference(xg.float(), m))):
        assert out.dtype == dtype
        _close(out, want, rel)


def test_rows_dequantize_bit_for_bit(kernels):
    """The slab path's decoding, to float32 and to bf16: any rows (block-aligned or not), every code, the
    format's own values (exact in bf16 too: 4 significant bits times a power of two)."""
    g = torch.Generator().manual_seed(9)
    m = _matrix(390, 264, g)
    want = dequantize_fp8(m.q, m.scale)  # [390, 264]
    assert torch.equal(want.bfloat16().float(), want)  # the values the bf16 rows must hold exactly
    for dtype in (torch.float32, torch.bfloat16):
        for r0, r1 in ((0, 128), (100, 390), (250, 251)):
            out = torch.full((r1 - r0, 264), float("nan"), dtype=dtype)
            assert kernels.fp8_dequantize_rows(m.q, m.scale, r0, r1, out)
            assert torch.equal(out.float(), want[r0:r1])
    assert not kernels.fp8_dequantize_rows(m.q, m.scale, 0, 2, torch.empty(2, 264, dtype=torch.float16))


def test_the_bench_times_the_three_variants_and_refuses_what_the_kernel_cannot_take(capsys):
    from ostinato.bench import bf16_matmul, fp8_linear
    fp8_linear.main(["--shapes", "256x264", "--tokens", "1,3", "--rounds", "1", "--calls", "1", "--isas", "avx2"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith(("1 |", "3 |"))]
    assert len(rows) == 2 and all(len(r.split("|")) == 5 for r in rows)  # tokens, fp8, bf16, float32, ratio
    paths = [isa for isa in fp8_linear.CODE_PATHS if supports(isa)]
    fp8_linear.main(["--shapes", "256x264", "--tokens", "2", "--rounds", "1", "--calls", "1"])  # every path here
    out = capsys.readouterr().out
    assert all(f"fp8 {isa} ms" in out for isa in paths)
    row = next(line for line in out.splitlines() if line.strip().startswith("2 |"))
    columns = len(paths) + ("avx512_bf16" in paths)  # each path's fp8 column, and avx512_bf16's with bf16 x
    assert ("fp8 avx512_bf16 bf16 x ms" in out) == ("avx512_bf16" in paths)
    assert len(row.split("|")) == 3 + 2 * columns  # tokens, the fp8 columns, bf16, float32, a ratio per fp8 column
    with pytest.raises(SystemExit):
        fp8_linear.main(["--isas", "sse4"])
    with pytest.raises(SystemExit):
        fp8_linear.main(["--shapes", "256x260"])  # K not a multiple of 8
    with pytest.raises(SystemExit):
        fp8_linear.main(["--tokens", "5"])  # the kernel's limit is 4
    with pytest.raises(SystemExit):
        bf16_matmul.main(["--shapes", "256"])  # the shared parser: NxK


def test_the_prefill_bench_times_both_slab_dtypes_against_the_bf16_copy(capsys):
    from ostinato.bench import fp8_prefill
    fp8_prefill.main(["--shapes", "256x264,128x136", "--tokens", "5,17", "--rounds", "1", "--calls", "1"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip().startswith(("5 |", "17 |"))]
    assert len(rows) == 4 and all(len(r.split("|")) == 5 for r in rows)  # tokens, 3 variants, the ratio
    assert all(float(r.split("|")[-1]) > 0 for r in rows)
    with pytest.raises(SystemExit):
        fp8_prefill.main(["--shapes", "256x260"])  # K a multiple of 8 (the decoder's)
