"""The plan's Triton expert kernels (hot routes) on the GPU: prefill and decode against the float32
reference at the tiny model's and V4-Flash's shapes; decode launches and the prefill kernel's two launches
replayed from a CUDA graph against the same launches run eagerly. Tolerances by gpu_setup.tolerance: the
kernels' products are exact (x is rounded to its dtype for the reference too, the weights are exact in
any operand dtype) and accumulate in float32 over D then I terms, with prefill's intermediate h rounded
once to its dtype (x's when 16-bit; decode's is float32); two runs of the same launches differ only in
the order of the k routes' float32 atomic adds."""

from __future__ import annotations

import pytest
import torch

from ostinato.bench.gpu_setup import (
    captured,
    hot_decode_launches,
    prefill_launches,
    random_experts,
    rel_err,
    tolerance,
)
from ostinato.runtime.kernels import triton_experts as tx
from ostinato.runtime.kernels.reference import dequantize_expert, moe_experts_reference
from ostinato.runtime.kernels.routes import group_routes
from ostinato.runtime.kernels.triton_experts import prefill_h_dtype

pytestmark = pytest.mark.gpu
CUDA = torch.cuda.is_available()
# Triton's interpreter computes bf16 wrongly (it multiplies raw uint16): the CPU run checks float32 only
INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16) if CUDA else (torch.float32,)
SHAPES = ("tiny", "v4-flash") if CUDA else ("tiny",)
ROUTES_PER_EXPERT = (16, 64, 256, 1024, 4096) if CUDA else (16,)


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES)
def test_prefill_and_decode_match_the_float32_reference(h200, shape, dtype):
    """A prefill over T tokens and one decode launch per token, on 8 experts, each token routed to k of them."""
    cfg, dev = (h200.tiny if shape == "tiny" else h200.cfg), h200.device
    D, I, k, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok, 8
    T = 24 if CUDA else 3
    pre, dec = h200.expert_kernels(cfg)
    experts = random_experts(cfg, E, D)
    pool = tx.HotPool.stack(experts, dev)
    g = torch.Generator().manual_seed(1)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])  # [T, k]
    weights = torch.rand(T, k, generator=g)
    routes = group_routes(ids, weights, E)
    x = torch.randn(T, D, generator=g).to(dtype)
    ref = moe_experts_reference(x.float(), routes, experts, torch.zeros(T, D), float(cfg.swiglu_limit),
                                [dequantize_expert(e) for e in experts])
    prefill = tx.prefill_experts(pre, x.to(dev), routes, pool, torch.zeros(T, D, device=dev))
    decode, h = torch.zeros(T, D, device=dev), torch.empty(k, I, device=dev)
    for t in range(T):
        tx.decode_experts(dec, x.to(dev), ids[t].int().to(dev), torch.full((k,), t, dtype=torch.int32, device=dev),
                          weights[t].to(dev), pool, decode, h)
    assert rel_err(prefill, ref) <= tolerance(prefill_h_dtype(pre, dtype), D + I)
    assert rel_err(decode, ref) <= tolerance(torch.float32, D + I)


def test_decode_graph_replay_equals_eager_launches(h200):
    """The hot decode rate's launches over distinct experts in one graph, with a masked padding route (as
    when a route is cold) written into the captured buffers after capture."""
    launches = hot_decode_launches(h200, 10 if CUDA else 2)
    replay = captured(launches.run, h200.device)
    launches.slots[-1][-1] = -1
    launches.out.zero_()
    replay()
    graph_out = launches.out.clone()
    launches.out.zero_()
    launches.run()
    assert rel_err(graph_out, launches.out) <= tolerance(torch.float32, h200.cfg.num_experts_per_tok)


@pytest.mark.parametrize("routes_per_expert", ROUTES_PER_EXPERT)
def test_prefill_graph_replay_equals_the_launcher(h200, routes_per_expert):
    """The prefill rate's two launches (k experts, r tokens each routed to all of them), replayed."""
    launches = prefill_launches(h200, routes_per_expert)
    replay = captured(launches.run, h200.device)
    launches.out.zero_()
    replay()
    assert rel_err(launches.out, launches.launcher()) <= tolerance(torch.float32, h200.cfg.num_experts_per_tok)
