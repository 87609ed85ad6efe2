"""The FP8 dense kernel (dense weights as stored: e4m3 with 128x128 block scales) on the GPU against the
float32 product on the dequantized weights, with activations in the engine's dtype (bf16; float16 on the
CPU): a decode token through every distinct dense FP8 matrix shape of V4-Flash (the tiny model's on the
CPU), and a 4096-token prefill through wo_b (4096 x 8192). The reference takes the same rounded
activations, so the two differ by the output's rounding to that dtype and float32 sums in another order
(split-K): gpu_setup.tolerance."""

from __future__ import annotations

import pytest
import torch

from ostinato.bench.gpu_setup import activation_dtype, dense_fp8_shapes, rel_err, tolerance
from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
from ostinato.runtime.kernels.fp8_triton import fp8_linear
from ostinato.runtime.kernels.scale_layout import word_aligned

pytestmark = pytest.mark.gpu


def error(device: torch.device, T: int, N: int, K: int) -> float:
    g = torch.Generator().manual_seed(T + N + K)
    q, s = quantize_fp8(torch.randn(N, K, generator=g) * 0.02)
    x = torch.randn(T, K, generator=g).to(activation_dtype(device))
    got = fp8_linear(x.to(device), q.to(device), word_aligned(s.view(torch.uint8).to(device)))
    return rel_err(got, x.float() @ dequantize_fp8(q, s).T) / tolerance(x.dtype, K)


def test_fp8_gemv_matches_the_float32_product_on_every_dense_shape(h200):
    over = {f"{N}x{K}": e for (N, K) in dense_fp8_shapes(h200.cfg) if (e := error(h200.device, 1, N, K)) > 1}
    assert not over, f"error / tolerance above 1 at shapes {over}"


def test_fp8_gemm_matches_the_float32_product(h200):
    N, K = next(shape for shape, names in dense_fp8_shapes(h200.cfg).items() if "wo_b" in names)
    assert error(h200.device, 4096 if h200.cuda else 64, N, K) <= 1
