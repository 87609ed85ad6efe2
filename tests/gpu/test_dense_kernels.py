"""The plan's generated dense-path kernels on the GPU against the torch reference: mHC mixing, norms, rope and
the head's logits, at V4-Flash's widths on CUDA (16,384-channel norms, 64 heads of 512 with 64 rope
channels, an 8192 x 4096 head slice). Tolerances by gpu_setup.tolerance: the kernels accumulate in float32
and round once to the output's dtype, as the references do."""

from __future__ import annotations

import pytest
import torch

from ostinato.bench.gpu_setup import rel_err, tolerance
from ostinato.plan import KernelName
from ostinato.runtime.kernels.dense_ops import DenseOpsKernel
from ostinato.runtime.kernels.hc_mix import HcMixKernel
from ostinato.runtime.kernels.triton_experts import load_triton_module
from ostinato.runtime.model.hyper_connection import HcWeights, mix_weights
from ostinato.runtime.model.norms import rms_norm, unweighted_rms_norm
from ostinato.runtime.model.rope import apply_rope

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16) if CUDA else (torch.float32,)  # see test_hot_kernels
T, HEADS, HEAD_DIM = (16, 64, 512) if CUDA else (3, 2, 128)


def artifact(plan, name: KernelName):
    return plan.resolve(plan.kernel(name).path)


@pytest.fixture(scope="module")
def dense_ops(h200) -> DenseOpsKernel:
    plan = h200.plan
    return DenseOpsKernel(artifact(plan, KernelName.DENSE_OPS_CPU),
                          load_triton_module(artifact(plan, KernelName.DENSE_OPS_TRITON)))


def test_hc_mix_matches_the_float32_reference(h200):
    mixk = HcMixKernel(artifact(h200.plan, KernelName.HC_MIX_CPU),
                       load_triton_module(artifact(h200.plan, KernelName.HC_MIX_TRITON)))
    g, n = torch.Generator().manual_seed(3), mixk.n
    m = (2 + n) * n
    mix = torch.randn(T, m, generator=g) * 3
    hw = HcWeights(torch.empty(m, 0), torch.randn(m, generator=g), torch.rand(3, generator=g) + 0.5)
    ref = mix_weights(mix, hw, n, mixk.iters, mixk.eps)
    dev = h200.device
    got = mixk(mix.to(dev), hw.base.to(dev), hw.scale.to(dev))
    # each Sinkhorn iteration normalizes over n terms: m x iters float32 roundings in all, in any order
    assert max(rel_err(a, b) for a, b in zip(got, ref)) <= tolerance(torch.float32, m * mixk.iters)


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
def test_norms_and_rope_match_the_reference_in_their_dtype(h200, dense_ops, dtype):
    """Against a reference in the same dtype on the same device: both round once to it, after float32 sums
    over the norm's width (rope: two products)."""
    g, dev = torch.Generator().manual_seed(3), h200.device
    width = h200.cfg.hc_dim  # the mHC residual: hc_mult streams of hidden_size
    angles = torch.rand(T, 32, generator=g) * 1000
    cos, sin = angles.cos().to(dev), angles.sin().to(dev)
    w = torch.randn(width, generator=g).to(dev)
    x = (torch.randn(T, width, generator=g) * 3).to(dtype).to(dev)
    heads = (torch.randn(T, HEADS, HEAD_DIM, generator=g) * 3).to(dtype).to(dev)
    pairs = {"rms_norm": (dense_ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6)),
             "unweighted_rms_norm": (dense_ops.unweighted_rms_norm(x, 1e-6), unweighted_rms_norm(x, 1e-6)),
             "rope": (dense_ops.rope(heads, cos, sin, False), apply_rope(heads, cos, sin)),
             "inverse rope": (dense_ops.rope(heads, cos, sin, True), apply_rope(heads, cos, sin, inverse=True))}
    terms = {"rms_norm": width, "unweighted_rms_norm": width, "rope": 2, "inverse rope": 2}
    over = {name: rel_err(a, b) / tolerance(dtype, terms[name]) for name, (a, b) in pairs.items()}
    assert max(over.values()) <= 1, f"error / tolerance: {over}"


def test_head_logits_match_the_float32_product(h200, dense_ops):
    """2 tokens through bf16 head rows."""
    g, dev = torch.Generator().manual_seed(3), h200.device
    V, D = (8192, 4096) if CUDA else (300, 64)
    h, head = torch.randn(2, D, generator=g).to(dev), (torch.randn(V, D, generator=g) * 0.05).bfloat16().to(dev)
    assert rel_err(dense_ops.head_logits(h, head), h @ head.float().T) <= tolerance(torch.float32, D)
