"""Dense FP8 matmul from the checkpoint's bytes (runtime/kernels/fp8_triton.py), in Triton's interpreter
(conftest sets TRITON_INTERPRET=1 without a GPU), against the float32 reference on the dequantized
weights; and the FP8 matrix type's CPU twin, which must compute what a bf16 plan computes."""

from __future__ import annotations

import pytest
import torch

from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
from ostinato.runtime.kernels.fp8_triton import fp8_linear
from ostinato.runtime.kernels.scale_layout import is_word_aligned, word_aligned
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
    got = fp8_linear(x, q, word_aligned(s.view(torch.uint8)))
    assert got.dtype == torch.float32 and got.shape == (T, 256)
    assert (got - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.slow  # Triton's interpreter
def test_every_code_and_scale_decodes_exactly():
    """Row r of W holds all 254 finite e4m3 codes (plus two zeros) at block scale byte r x 2; x = identity."""
    finite = [c for c in range(256) if c & 0x7F != 0x7F]  # 0x7F / 0xFF are NaN
    codes = torch.tensor(finite + [0, 0], dtype=torch.uint8).repeat(128, 1)  # [128, 256]
    q = codes.view(torch.float8_e4m3fn)
    scale = torch.tensor([[60, 190]], dtype=torch.uint8)  # 2^-67 and 2^63: K blocks at both extremes
    got = fp8_linear(torch.eye(256), q, word_aligned(scale))  # [256 tokens, 128 rows]: token j reads column j
    assert torch.equal(got.T, dequantize_fp8(q, scale.view(torch.float8_e8m0fnu)))


@pytest.mark.slow  # Triton's interpreter
def test_float16_activations_use_a_half_precision_dot():
    g = torch.Generator().manual_seed(7)
    q, s = _random_fp8(128, 256, g)
    x = torch.randn(3, 256, generator=g).half()
    ref = x.float() @ dequantize_fp8(q, s).T
    got = fp8_linear(x, q, word_aligned(s.view(torch.uint8)))
    assert got.dtype == torch.float16 and (got.float() - ref).abs().max() <= 2e-3 * ref.abs().max()


def test_shapes_are_checked():
    q, s = _random_fp8(128, 256, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="do not match"):
        fp8_linear(torch.zeros(2, 128), q, word_aligned(s.view(torch.uint8)))


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


def test_scales_that_are_not_on_words_are_refused_before_the_launch():
    """Rows 128.. of a contiguous [2, 2] scale start at byte 2: a GPU's word read would fault there
    (misaligned address); the interpreter would not notice, so the launcher checks, on the CPU too."""
    q, s = _random_fp8(256, 256, torch.Generator().manual_seed(3))
    plain = s.view(torch.uint8)                      # [2, 2] contiguous: row 1 at byte 2
    assert not is_word_aligned(plain[1:])
    with pytest.raises(ValueError, match="not laid out on 4-byte words"):
        fp8_linear(torch.zeros(1, 256), q[128:], plain[1:])


@pytest.mark.parametrize("k", [256, 384, 512, 4096])
def test_held_scales_stay_on_words_through_rows_cat_and_to(k):
    """The tiny and small presets' K (256: 2 scale bytes a row) and V4-Flash's (4096: 32)."""
    q, s = _random_fp8(384, k, torch.Generator().manual_seed(k))
    m = Fp8Matrix.of_bytes(q, s.view(torch.uint8))
    assert torch.equal(m.scale, s.view(torch.uint8))    # the same bytes, in the word layout
    for part in (m, m.rows(0, 128), m.rows(128, 256), m.rows(256, 384), m.to("cpu"),
                 Fp8Matrix.cat([m.rows(128, 256), m.rows(0, 128)])):
        assert is_word_aligned(part.scale), tuple(part.scale.shape)
    if k % 512 == 0:                                   # whole words already: nothing padded, nothing copied
        assert m.scale.data_ptr() == s.data_ptr()


@pytest.mark.slow  # Triton's interpreter
def test_a_row_view_computes_what_the_whole_matrix_does():
    """grouped_linear's cut of wo_a on a GPU: each group's rows through the kernel, scale rows at offsets."""
    g = torch.Generator().manual_seed(11)
    q, s = _random_fp8(384, 256, g)
    m = Fp8Matrix.of_bytes(q, s.view(torch.uint8))
    x = torch.randn(2, 256, generator=g)
    whole = x @ dequantize_fp8(q, s).T
    for a in (0, 128, 256):
        part = m.rows(a, a + 128)
        got = fp8_linear(x, part.q, part.scale)
        assert (got - whole[:, a:a + 128]).abs().max() <= 1e-5 * whole.abs().max()
