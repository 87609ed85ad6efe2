"""The plan's mHC mixing kernels (templates/*/hc_mix.*.j2) against the reference mix_weights, on fresh
random logits: the host library, the Triton kernel (interpreter, float32) and the torch op around them."""

import pytest
import torch

from ostinato.compiler.codegen.hc_mix import HcMixParams, build_cpu_hc_mix, render_triton_hc_mix
from ostinato.runtime.engine.op_count import OpCounter
from ostinato.runtime.kernels.hc_mix import HcMixKernel
from ostinato.runtime.kernels.triton_experts import load_triton_module
from ostinato.runtime.model.hyper_connection import HcWeights, mix_weights

pytestmark = pytest.mark.slow  # compiled kernels (C++; Triton under the interpreter)

# (N, Sinkhorn iterations, eps): V4's 4 streams and 20 iterations; 3 streams (Triton pads to 4); one round
SHAPES = [(4, 20, 1e-6), (3, 7, 1e-4), (2, 1, 0.0)]


def random_mix(n: int, t: int, seed: int) -> tuple[torch.Tensor, HcWeights]:
    g = torch.Generator().manual_seed(seed)
    m = (2 + n) * n
    mix = torch.randn(t, m, generator=g) * 3  # logits wide enough that softmax and Sinkhorn do real work
    w = HcWeights(torch.empty(m, 0), torch.randn(m, generator=g), torch.rand(3, generator=g) + 0.5)
    return mix, w


def kernels(root, n, iters, eps, triton: bool) -> HcMixKernel:
    """Built into `root`: the session's kernel folder (tests/conftest.py)."""
    params = HcMixParams(n=n, iters=iters, eps=eps)
    module = load_triton_module(render_triton_hc_mix(params, root).path) if triton else None
    return HcMixKernel(build_cpu_hc_mix(params, root).path, module)


def assert_same(got, ref, what: str) -> None:
    for name, a, b in zip(("pre", "post", "comb"), got, ref, strict=True):
        assert a.shape == b.shape, (what, name, a.shape, b.shape)
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-7, msg=lambda m: f"{what} {name}: {m}")


@pytest.mark.parametrize("n,iters,eps", SHAPES)
def test_host_kernel_matches_the_reference(kernel_dir, n, iters, eps):
    k = kernels(kernel_dir, n, iters, eps, triton=False)
    assert (k.n, k.iters, k.eps) == (n, iters, eps)
    for t, seed in ((1, 0), (5, 1), (64, 2), (0, 3)):
        mix, w = random_mix(n, t, seed)
        assert_same(k(mix, w.base, w.scale), mix_weights(mix, w, n, iters, eps), f"host N={n} T={t}")


@pytest.mark.parametrize("n,iters,eps", SHAPES)
def test_triton_kernel_matches_the_reference(kernel_dir, n, iters, eps):
    k = kernels(kernel_dir, n, iters, eps, triton=True)
    for t, seed in ((1, 4), (6, 5)):
        mix, w = random_mix(n, t, seed)
        out = torch.empty_like(mix)
        k.triton.hc_mix_kernel[(t,)](mix, w.base, w.scale, out)
        got = (out[:, :n], out[:, n:2 * n], out[:, 2 * n:].view(t, n, n))
        assert_same(got, mix_weights(mix, w, n, iters, eps), f"triton N={n} T={t}")


def test_one_op_replaces_the_reference_dispatches(kernel_dir):
    k = kernels(kernel_dir, 4, 20, 1e-6, triton=False)
    mix, w = random_mix(4, 3, 6)
    with OpCounter() as fused:
        k(mix, w.base, w.scale)
    with OpCounter() as reference:
        mix_weights(mix, w, 4, 20, 1e-6)
    assert fused.by_op == {"ostinato.hc_mix.default": 1}, fused.by_op
    assert reference.ops > 100, reference.ops


def test_bad_inputs_are_refused(kernel_dir):
    k = kernels(kernel_dir, 4, 20, 1e-6, triton=False)
    mix, w = random_mix(4, 2, 7)
    with pytest.raises(ValueError, match="mix must be a contiguous float32"):
        k(mix.double(), w.base, w.scale)
    with pytest.raises(ValueError, match="base must be"):
        k(mix, w.base[:-1], w.scale)
    with pytest.raises(ValueError, match="hc_sinkhorn_iters"):
        HcMixParams(n=4, iters=0, eps=1e-6)
