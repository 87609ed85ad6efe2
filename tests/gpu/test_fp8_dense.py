"""The FP8 dense kernel (dense weights as stored: e4m3 with 128x128 block scales) on the GPU against the
float32 product on the dequantized weights: a decode token through V4-Flash's largest dense matrix (wq_b,
32768 x 1024) and a 4096-token prefill through wo_b (4096 x 8192); tiny shapes on the CPU."""

from __future__ import annotations

import pytest
import torch

from ostinato.bench.gpu_setup import rel_err
from ostinato.checkpoint.formats import dequantize_fp8, quantize_fp8
from ostinato.runtime.kernels.fp8_triton import fp8_linear
from ostinato.runtime.kernels.scale_layout import word_aligned

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()
SHAPES = ((1, 32768, 1024), (4096, 4096, 8192)) if CUDA else ((1, 256, 128), (64, 128, 256))  # T, N, K
ACTIVATIONS = torch.bfloat16 if CUDA else torch.float16  # Triton's interpreter computes bf16 wrongly


@pytest.mark.parametrize(("T", "N", "K"), SHAPES)
def test_fp8_linear_matches_the_float32_product(h200, T, N, K):
    g = torch.Generator().manual_seed(T)
    q, s = quantize_fp8(torch.randn(N, K, generator=g) * 0.02)
    x = torch.randn(T, K, generator=g)
    dev = h200.device
    got = fp8_linear(x.to(dev, ACTIVATIONS), q.to(dev), word_aligned(s.view(torch.uint8).to(dev)))
    assert rel_err(got, x @ dequantize_fp8(q, s).T) <= 1e-2
