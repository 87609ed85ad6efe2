"""The plan's row-wise dense-op kernels (templates/*/dense_ops.*.j2) against the torch reference
(runtime/model/norms.py, rope.py), on fresh random inputs: the host library in float32 and bf16 (on each
ISA code path this CPU has), the Triton kernels under the interpreter in float32 and float16, one torch op
per call, and the switch that lets only a plan's forwards use them."""

import pytest
import torch

from ostinato.compiler.codegen.dense_ops import build_cpu_dense_ops, code_path, render_triton_dense_ops
from ostinato.isa import detect_isa
from ostinato.runtime.engine.op_count import OpCounter
from ostinato.runtime.kernels.dense_ops import DenseOpsKernel
from ostinato.runtime.kernels.triton_experts import load_triton_module
from ostinato.runtime.model import fused
from ostinato.runtime.model.norms import rms_norm, unweighted_rms_norm
from ostinato.runtime.model.rope import apply_rope

pytestmark = pytest.mark.slow  # compiled kernels (C++; Triton under the interpreter)

# float32: the same arithmetic in another summation order; bf16/fp16: one rounding step apart at most
TOL = {torch.float32: dict(rtol=2e-6, atol=1e-6), torch.bfloat16: dict(rtol=2 ** -7, atol=1e-6),
       torch.float16: dict(rtol=2 ** -10, atol=1e-5)}


@pytest.fixture(scope="module")
def kernels(kernel_dir):
    return DenseOpsKernel(build_cpu_dense_ops(kernel_dir).path,
                          load_triton_module(render_triton_dense_ops(kernel_dir).path))


@pytest.fixture(scope="module")
def host_kernels(kernel_dir, host_isa):
    """The host library alone, on each ISA code path this CPU has."""
    return DenseOpsKernel(build_cpu_dense_ops(kernel_dir, isa=host_isa).path, None)


def inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    w = torch.randn(shape[-1], generator=g)
    angles = torch.rand(shape[0], 8, generator=g) * 1000  # [T, R2 = 8]: far positions, as in long contexts
    return x, w, angles.cos(), angles.sin()


def references(x, w, cos, sin):
    return {"rms_norm": rms_norm(x, w, 1e-6), "rms_norm (no weight)": rms_norm(x, None, 1e-6),
            "unweighted_rms_norm": unweighted_rms_norm(x, 1e-6), "rope": apply_rope(x, cos, sin),
            "rope inverse": apply_rope(x, cos, sin, inverse=True)}


def host(k, x, w, cos, sin):
    return {"rms_norm": k.rms_norm(x, w, 1e-6), "rms_norm (no weight)": k.rms_norm(x, None, 1e-6),
            "unweighted_rms_norm": k.unweighted_rms_norm(x, 1e-6), "rope": k.rope(x, cos, sin, False),
            "rope inverse": k.rope(x, cos, sin, True)}


def assert_close(got: dict, ref: dict, dtype, what: str) -> None:
    for name in ref:
        assert got[name].dtype == ref[name].dtype and got[name].shape == ref[name].shape, (what, name)
        torch.testing.assert_close(got[name].float(), ref[name].float(), **TOL[dtype],
                                   msg=lambda m: f"{what} {name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (7, 3, 48), (33, 2, 4, 40)])  # [T, C], [T, heads, C], more dims
def test_host_kernels_match_the_reference(host_kernels, dtype, shape):
    x, w, cos, sin = inputs(shape, dtype, seed=sum(shape))
    assert_close(host(host_kernels, x, w, cos, sin), references(x, w, cos, sin), dtype, f"host {shape} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter computes bf16 wrongly
def test_triton_kernels_match_the_reference(kernels, dtype):
    t = kernels.triton
    for shape in ((3, 40), (2, 3, 48)):
        x, w, cos, sin = inputs(shape, dtype, seed=5)
        C, rows = shape[-1], x.numel() // shape[-1]
        got = {}
        for name, weight, unweighted in (("rms_norm", w, False), ("rms_norm (no weight)", None, False),
                                         ("unweighted_rms_norm", None, True)):
            got[name] = torch.empty_like(x)
            t.rms_norm_kernel[(rows,)](x, got[name], weight if weight is not None else x, C, 1e-6,
                                       HAS_WEIGHT=weight is not None, UNWEIGHTED=unweighted, BLOCK_C=64)
        for name, inverse in (("rope", False), ("rope inverse", True)):
            got[name] = torch.empty_like(x)
            t.rope_kernel[(rows,)](x, got[name], cos, sin, C, 16, rows // shape[0], INVERSE=inverse, BLOCK_C=64,
                                   BLOCK_R2=16)
        assert_close(got, references(x, w, cos, sin), dtype, f"triton {shape} {dtype}")


def test_only_a_forward_with_the_kernels_active_uses_them(kernels):
    x, w, cos, sin = inputs((4, 2, 48), torch.float32, seed=9)
    with OpCounter() as plain:
        rms_norm(x, w, 1e-6), apply_rope(x, cos, sin)
    with fused.using(kernels), OpCounter() as fast:
        rms_norm(x, w, 1e-6), apply_rope(x, cos, sin)
    assert fast.by_op == {"ostinato.rms_norm.default": 1, "ostinato.rope.default": 1}, fast.by_op
    assert not any(op.startswith("ostinato") for op in plain.by_op) and plain.ops >= 12, plain.by_op
    assert fused.active() is None
    with fused.using(kernels):  # what the kernels do not take falls back to the reference
        strided = x.transpose(0, 1)
        torch.testing.assert_close(rms_norm(strided, w, 1e-6), rms_norm(strided.contiguous(), w, 1e-6))


def test_bad_inputs_are_refused(kernels):
    x, w, cos, sin = inputs((3, 48), torch.float32, seed=11)
    with pytest.raises(ValueError, match="weight must be a contiguous float32"):
        kernels.rms_norm(x, w[:-1], 1e-6)
    with pytest.raises(ValueError, match="cos must be a contiguous float32"):
        kernels.rope(x, cos[:2], sin, False)
    with pytest.raises(ValueError, match="rejected"):
        kernels.rope(x[:, :8].contiguous(), cos, sin, False)  # 16 rope channels in a row of 8


def head_reference(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return h @ w.float().T  # the bf16 rows widened exactly, a float32 matmul


@pytest.mark.parametrize("T", [1, 2, 3, 4])
def test_host_head_logits_match_the_float32_product(host_kernels, T):
    g = torch.Generator().manual_seed(T)
    # 40, 88: the last 8 and 24 columns after 16- or 32-column steps; 1000: not a whole number of 256-row chunks
    for V, D in ((1000, 64), (300, 40), (260, 88)):
        h, w = torch.randn(T, D, generator=g), (torch.randn(V, D, generator=g) * 0.05).bfloat16()
        got = host_kernels.head_logits(h, w)
        assert got.shape == (T, V) and got.dtype == torch.float32
        torch.testing.assert_close(got, head_reference(h, w), rtol=1e-5, atol=1e-6)
    assert host_kernels.takes_head(h, w) and not host_kernels.takes_head(torch.randn(5, D), w)  # 5: the reference


@pytest.mark.parametrize("T", [1, 2, 3, 4])
def test_host_head_logits_of_a_bf16_h_are_its_exact_products_summed_in_float32(host_kernels, host_isa, T):
    """A bf16 plan's h (bf16) against the float64 product of the same bf16 values: on avx512_bf16 builds through
    ost_head_logits_bf16 (vdpbf16ps; 64-column steps, masked tails), elsewhere widened to the float32 head."""
    g = torch.Generator().manual_seed(40 + T)
    assert host_kernels.head_bf16_dot == (host_isa == "avx512_bf16")
    calls = {"bf16": 0, "float32": 0}
    lib = host_kernels.lib
    products = {name: getattr(lib, name) for name in ("ost_head_logits", "ost_head_logits_bf16")}  # with argtypes
    for name, key in (("ost_head_logits", "float32"), ("ost_head_logits_bf16", "bf16")):
        setattr(lib, name, lambda *a, f=products[name], key=key: calls.__setitem__(key, calls[key] + 1) or f(*a))
    try:
        # D: whole 64-column steps (128), a tail in the first 32 lanes (40, 88) and in both (64 + 56 = 120); V: not
        # a whole number of 256-row work items
        for V, D in ((1000, 128), (300, 40), (260, 88), (513, 120)):
            h, w = (torch.randn(T, D, generator=g) * 3).bfloat16(), (torch.randn(V, D, generator=g) * 0.05).bfloat16()
            got = host_kernels.head_logits(h, w)
            assert got.shape == (T, V) and got.dtype == torch.float32
            want = (h.double() @ w.double().T).float()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    finally:
        for name, f in products.items():
            setattr(lib, name, f)
    assert calls == ({"bf16": 4, "float32": 0} if host_kernels.head_bf16_dot else {"bf16": 0, "float32": 4})


def test_a_bf16_model_multiplies_its_head_in_bf16_on_every_path(tiny_ckpt, kernel_dir):
    """Model.head of a bf16 model rounds h to bf16 (docs/model.md 3.7) whether the plan's kernel or the
    reference's float32 row blocks compute it: the two agree to float32 summation; a float32 model's do too,
    and differ from the bf16 model's by h's rounding only."""
    from ostinato.runtime import load_model

    kernels = DenseOpsKernel(build_cpu_dense_ops(kernel_dir).path, None)
    heads = {}
    for dtype in (torch.float32, torch.bfloat16):
        m = load_model(tiny_ckpt, dtype=dtype)
        streams = torch.randn(3, m.config.hc_mult, m.config.hidden_size, generator=torch.Generator().manual_seed(5))
        reference = m.head(streams)
        with fused.using(kernels):
            fast = m.head(streams)
        torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)
        heads[dtype] = reference
    gap = (heads[torch.bfloat16] - heads[torch.float32]).abs().max() / heads[torch.float32].abs().max()
    assert 0 < gap < 2 ** -6  # bf16's rounding of h: present, and no more


@pytest.mark.parametrize("T", [1, 2])
def test_the_heads_prefetch_and_row_groups_change_no_logit(host_kernels, host_isa, kernel_dir, T):
    """Builds with other prefetch distances (none, one row ahead at most) and other numbers of rows sharing a load
    of x (3: 700 rows leave a remainder) give the plan build's logits bit for bit."""
    g = torch.Generator().manual_seed(21)
    h, w = torch.randn(T, 264, generator=g), (torch.randn(700, 264, generator=g) * 0.05).bfloat16()
    want = host_kernels.head_logits(h, w)
    for distance, rows in ((8, 1), (0, 3), (4096, 4)):
        other = DenseOpsKernel(build_cpu_dense_ops(kernel_dir, head_prefetch_bytes=distance, isa=host_isa,
                                                   head_rows=rows).path, None)
        assert torch.equal(other.head_logits(h, w), want), (distance, rows)


def test_triton_head_logits_match_the_float32_product(kernels):
    g = torch.Generator().manual_seed(12)
    h, w = torch.randn(2, 96, generator=g), (torch.randn(150, 96, generator=g) * 0.05).bfloat16()
    out = torch.empty(2, 150)
    kernels.triton.head_logits_kernel[(-(-150 // 64), 2)](h, w, out, 150, 96, BV=64, BD=64)
    torch.testing.assert_close(out, head_reference(h, w), rtol=1e-5, atol=1e-6)


def test_the_head_kernel_bench_times_every_distance_against_a_stream(capsys):
    from ostinato.bench import head_kernel
    head_kernel.main(["--vocab", "600", "--hidden", "64", "--distances", "0,4096", "--rounds", "1", "--calls", "2"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "ms" not in line]
    names = ["prefetch 0 B (the plan's)", "prefetch 4096 B"]
    if code_path(detect_isa()) == "avx512_bf16":  # the default build's: a bf16 h on its vdpbf16ps path too
        names += [f"{n}, bf16 h" for n in names]
    assert [r.split(" | ")[0] for r in rows] == [f"| {n}" for n in names] + ["| float32 stream"]
    assert rows[-1].endswith("| 1.00 |")  # the stream is its own reference
    with pytest.raises(SystemExit, match="--distances: comma-separated integers"):
        head_kernel.main(["--distances", "4k"])
    with pytest.raises(SystemExit, match="multiples of 8"):
        head_kernel.main(["--hidden", "60"])
