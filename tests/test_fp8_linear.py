"""Dense FP8 matmul from the checkpoint's bytes (runtime/kernels/fp8_triton.py), in Triton's interpreter
(conftest sets TRITON_INTERPRET=1 without a GPU), against the float32 reference on the dequantized
weights; and the FP8 matrix type's CPU twin, which must compute what a bf16 plan computes."""

from __future__ import annotations

import pytest
import torch

from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
from ostinato.runtime.kernels.fp8_triton import fp8_linear
from ostinato.runtime.model.fp8_matrix import Fp8Matrix, grouped_linear, linear


def _random_fp8(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 1, n)[:, None]  # rows of very different sizes
    return quantize_fp8(w)


@pytest.mark.parametrize("T", [1, 5, 33])
@pytest.mark.slow  # Triton's interpreter
def test_float32_activations_match_the_reference(T):
    g = torch.Generator().manual_seed(T)
    q, s = _random_fp8(256, 384, g)
    x = torch.randn(T, 384, generator=g)
    ref = x @ dequantize_fp8(q, s).T
    got = fp8_linear(x, q, s.view(torch.uint8))
    assert got.dtype == torch.float32 and got.shape == (T, 256)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.slow  # Triton's interpreter
def test_every_code_and_scale_decodes_exactly():
    """Row r of W holds all 254 finite e4m3 codes (plus two zeros) at block scale byte r x 2; x = identity."""
    finite = [c for c in range(256) if c & 0x7F != 0x7F]  # 0x7F / 0xFF are NaN
    codes = torch.tensor(finite + [0, 0], dtype=torch.uint8).repeat(128, 1)  # [128, 256]
    q = codes.view(torch.float8_e4m3fn)
    scale = torch.tensor([[60, 190]], dtype=torch.uint8)  # 2^-67 and 2^63: K blocks at both extremes
    got = fp8_linear(torch.eye(256), q, scale)  # [256 tokens, 128 rows]: token j reads column j
    assert torch.equal(got.T, dequantize_fp8(q, scale.view(torch.float8_e8m0fnu)))


@pytest.mark.slow  # Triton's interpreter
def test_float16_activations_use_a_half_precision_dot():
    g = torch.Generator().manual_seed(7)
    q, s = _random_fp8(128, 256, g)
    x = torch.randn(3, 256, generator=g).half()
    ref = x.float() @ dequantize_fp8(q, s).T
    got = fp8_linear(x, q, s.view(torch.uint8))
    assert got.dtype == torch.float16 and (got.float() - ref).abs().max() <= 2e-3 * ref.abs().max()


def test_shapes_are_checked():
    q, s = _random_fp8(128, 256, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="do not match"):
        fp8_linear(torch.zeros(2, 128), q, s.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_twin_equals_the_dequantized_matrix_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(1)
    q, s = _random_fp8(512, 256, g)
    w = Fp8Matrix(q, s.view(torch.uint8))
    dense = dequantize_fp8(q, s, dtype)
    x = torch.randn(4, 256, generator=g).to(dtype)
    assert torch.equal(linear(x, w), x @ dense.T)
    grouped = torch.randn(4, 3, 256, generator=g).to(dtype)  # 4 groups of 128 rows
    assert torch.equal(grouped_linear(grouped, w), grouped_linear(grouped, dense))
    halves = Fp8Matrix.cat([w.rows(0, 256), w.rows(256, 512)])
    assert torch.equal(halves.q.view(torch.uint8), q.view(torch.uint8)) and torch.equal(halves.scale, w.scale)
    with pytest.raises(ValueError, match="scale block"):
        w.rows(0, 100)


@pytest.mark.slow  # compiled plans (C++ kernels)
def test_an_fp8_plan_computes_what_a_bf16_plan_computes(tiny_ckpt, tmp_path, kernel_dir):
    """Same checkpoint, same placement, dense weights held as stored FP8 or dequantized to bf16: on the
    CPU the same logits bit for bit (prefill and decode steps), with half the bytes of those matrices."""
    from conftest import compile_tiny_plan

    from ostinato.runtime.engine.loader import load_engine

    logits, dense = {}, {}
    ids = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(3))
    for fmt in ("fp8", "bf16"):
        compile_tiny_plan(tiny_ckpt, tmp_path / fmt, kernel_dir, context=1024, max_hot_per_layer=4, dense_format=fmt)
        engine = load_engine(tmp_path / fmt / "plan.yaml", device="cpu")
        session = engine.new_session()
        steps = [session.prefill(ids[:30])[-1]] + [session.decode(int(t)) for t in ids[30:]]
        logits[fmt] = torch.stack(steps)
        dense[fmt] = next(m for m in engine.plan.memory if m.device == "gpu0").components["dense_weights"]
        attn = engine.model.weights.layers[1].attn
        assert isinstance(attn.wq_a, Fp8Matrix) == (fmt == "fp8")
        engine.close()
    assert torch.equal(logits["fp8"], logits["bf16"])
    assert dense["fp8"] < 0.8 * dense["bf16"]  # the FP8 matrices halve; norms, mHC, compressors stay float32
