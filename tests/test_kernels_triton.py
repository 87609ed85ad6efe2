"""Generated Triton expert kernels (templates/triton), run by the Triton interpreter on CPU tensors.

TRITON_INTERPRET is set only while this module's fixtures live (Triton reads it when a kernel is
decorated and launched), so GPU tests elsewhere in a session are not forced into the interpreter.
"""

from __future__ import annotations

import os

import pytest
import torch

from ostinato.compiler.codegen.kernels import TritonExpertParams, render_triton_experts
from ostinato.runtime.kernels.reference import moe_experts_reference
from ostinato.runtime.kernels.routes import group_routes
from ostinato.runtime.kernels.testing import random_packed_expert

D, I, E, MAX_ROUTES = 64, 64, 3, 8
BLOCKS = dict(block_m=16, block_n=32, block_k=32)


@pytest.fixture(scope="module")
def triton_mods(tmp_path_factory):
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    from ostinato.runtime.kernels import triton_experts as tx

    root = tmp_path_factory.mktemp("triton")
    prefill = tx.load_triton_module(render_triton_experts(TritonExpertParams(D, I, "prefill", **BLOCKS), root).path)
    decode = tx.load_triton_module(
        render_triton_experts(TritonExpertParams(D, I, "decode", max_routes=MAX_ROUTES, **BLOCKS), root).path)
    yield tx, prefill, decode
    if old is None:
        os.environ.pop("TRITON_INTERPRET")
    else:
        os.environ["TRITON_INTERPRET"] = old


@pytest.fixture(scope="module")
def experts():
    g = torch.Generator().manual_seed(0)
    return [random_packed_expert(D, I, g) for _ in range(E)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T", [3, 30])  # 30 tokens x top-2 of 3 experts: some experts need 2 route blocks
def test_prefill_matches_reference(triton_mods, experts, dtype, T):
    tx, prefill, _ = triton_mods
    g = torch.Generator().manual_seed(T)
    ids = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(T)])
    routes = group_routes(ids, torch.rand(T, 2, generator=g), E)
    assert T < 30 or routes.counts().max() > BLOCKS["block_m"]
    x = torch.randn(T, D, generator=g).to(dtype)
    prefill_out = torch.randn(T, D, generator=g)
    out = tx.prefill_experts(prefill, x, routes, tx.HotPool.stack(experts), prefill_out.clone())
    ref = moe_experts_reference(x.float(), routes, experts, torch.zeros(T, D))
    err = ((out - prefill_out) - ref).abs().max() / ref.abs().max()
    assert err <= 1e-5, err


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_matches_reference_and_padding_is_inert(triton_mods, experts, dtype):
    tx, _, decode = triton_mods
    g = torch.Generator().manual_seed(1)
    T = 4  # token 3 gets no valid route; the padding routes point at it
    ids = torch.tensor([[0, 2], [1, 2], [0, -1], [-1, -1]])
    routes = group_routes(ids, torch.rand(T, 2, generator=g), E)
    R = routes.token.numel()
    slot = torch.full((MAX_ROUTES,), -1, dtype=torch.int32)
    token = torch.full((MAX_ROUTES,), 3, dtype=torch.int32)
    weight = torch.full((MAX_ROUTES,), 1.0)
    slot[:R] = torch.repeat_interleave(torch.arange(E), routes.counts()).int()
    token[:R], weight[:R] = routes.token.int(), routes.weight
    x = torch.randn(T, D, generator=g).to(dtype)
    prefill_out = torch.randn(T, D, generator=g)
    h = torch.full((MAX_ROUTES, I), float("nan"))
    out = tx.decode_experts(decode, x, slot, token, weight, tx.HotPool.stack(experts), prefill_out.clone(), h)
    ref = moe_experts_reference(x.float(), routes, experts, torch.zeros(T, D))
    err = ((out - prefill_out) - ref).abs().max() / ref.abs().max()
    assert err <= 1e-5, err
    assert torch.equal(out[3], prefill_out[3])  # padding routes added nothing
    assert torch.isfinite(h[:R]).all() and torch.isnan(h[R:]).all()  # and wrote no scratch


def test_decode_rejects_wrong_route_count(triton_mods, experts):
    tx, _, decode = triton_mods
    with pytest.raises(ValueError, match="decode launch needs"):
        tx.decode_experts(decode, torch.zeros(1, D), torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32),
                          torch.zeros(3), tx.HotPool.stack(experts), torch.zeros(1, D), torch.zeros(3, I))


def test_variant_mismatch_is_rejected(triton_mods, experts):
    tx, prefill, _ = triton_mods
    with pytest.raises(ValueError, match="prefill"):
        tx.decode_experts(prefill, torch.zeros(1, D), *(torch.zeros(MAX_ROUTES) for _ in range(3)),
                          tx.HotPool.stack(experts), torch.zeros(1, D), torch.zeros(MAX_ROUTES, I))
