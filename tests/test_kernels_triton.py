"""Generated Triton expert kernels (templates/triton), run by the Triton interpreter on CPU tensors.

TRITON_INTERPRET is set only while this module's fixtures live (Triton reads it when a kernel is
decorated and launched), so GPU tests elsewhere in a session are not forced into the interpreter.
float32 and float16 activations only: the interpreter computes bf16 wrongly (it truncates instead of
rounding, and multiplies bf16 as raw uint16 in tl.dot); the GPU checks (tests/gpu/test_hot_kernels.py) run bf16.
Legend: D = hidden, I = expert intermediate (V4-Flash's aspect, D = 2I), E = experts, K = decode route slots.
"""

from __future__ import annotations

import os

import pytest
import torch

from ostinato.compiler.codegen.kernels import TritonExpertParams, render_triton_experts
from ostinato.runtime.kernels.reference import dequantize_expert, moe_experts_reference
from ostinato.runtime.kernels.routes import group_flat_routes, group_routes
from ostinato.runtime.kernels.testing import random_packed_expert

pytestmark = pytest.mark.slow  # Triton's interpreter

D, I, E, K = 256, 128, 4, 8
BLOCKS = dict(block_m=16, block_n=32, block_k=128)  # K steps: 2 over D, 1 over I; row blocks: 4 of I, 8 of D


@pytest.fixture(scope="module")
def triton_mods(kernel_dir):
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    from ostinato.runtime.kernels import triton_experts as tx

    root = kernel_dir  # the session's kernel folder (tests/conftest.py)
    prefill = tx.load_triton_module(render_triton_experts(TritonExpertParams(D, I, "prefill", **BLOCKS), root).path)
    decode = tx.load_triton_module(
        render_triton_experts(TritonExpertParams(D, I, "decode", max_routes=K, **BLOCKS), root).path)
    yield tx, prefill, decode
    if old is None:
        os.environ.pop("TRITON_INTERPRET")
    else:
        os.environ["TRITON_INTERPRET"] = old


@pytest.fixture(scope="module")
def experts():
    g = torch.Generator().manual_seed(0)
    return [random_packed_expert(D, I, g) for _ in range(E)]


def rel_err(out, base, ref):
    return (((out - base) - ref).abs().max() / ref.abs().max()).item()


def fp16_h_bound(x: torch.Tensor, routes, experts) -> torch.Tensor:
    """[T, D] bound on how far holding h in fp16 moves prefill's output (fp16 activations): each h
    element is rounded once to nearest fp16, by at most max(2^-11 |h|, 2^-25) (11 significant bits;
    steps of 2^-24 below 2^-14), and the down dot adds nothing else beyond float32 rounding (its fp16
    weight tiles are exact for these scales, its sums float32). So |out - ref| <= sum over a token's
    routes of weight x (max(2^-11 |h|, 2^-25) @ |w2|^T), h from the float32 reference."""
    bound = torch.zeros(x.shape[0], D)
    for e, expert in enumerate(experts):
        lo, hi = int(routes.offsets[e]), int(routes.offsets[e + 1])
        tok = routes.token[lo:hi]  # [n]
        w1, w3, w2 = dequantize_expert(expert)
        xe = x[tok].float()  # [n, D]
        h = torch.nn.functional.silu((xe @ w1.T).clamp(max=10.0)) * (xe @ w3.T).clamp(-10.0, 10.0)  # [n, I]
        dh = torch.clamp(h.abs() * 2.0 ** -11, min=2.0 ** -25)
        bound.index_add_(0, tok, (dh @ w2.abs().T) * routes.weight[lo:hi, None])  # [n, D] into [T, D]
    return bound


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T", [3, 40])
def test_prefill_matches_reference(triton_mods, experts, dtype, T):
    """Expert 3 gets no route, expert 2 one; at T=40 expert 0 has all 40 (3 route blocks of 16).
    float32 x keeps h float32 and matches to float32 rounding (1e-5 of the largest output); fp16 x holds
    h in fp16 (so the down dot runs fp16 MMAs on a GPU): within fp16_h_bound of the reference, plus the
    same float32 allowance, and off by more than float32 rounding alone (h really is rounded)."""
    tx, prefill, _ = triton_mods
    g = torch.Generator().manual_seed(10 + T)
    ids = torch.stack([torch.tensor([0, 1]) if t else torch.tensor([0, 2]) for t in range(T)])  # [T, 2]
    routes = group_routes(ids, torch.rand(T, 2, generator=g), E)
    assert routes.counts().tolist() == [T, T - 1, 1, 0]
    x = torch.randn(T, D, generator=g).to(dtype)
    base = torch.randn(T, D, generator=g)
    out = tx.prefill_experts(prefill, x, routes, tx.HotPool.stack(experts), base.clone())
    ref = moe_experts_reference(x.float(), routes, experts, torch.zeros(T, D))
    if dtype == torch.float32:
        assert rel_err(out, base, ref) <= 1e-5
    else:
        err = ((out - base) - ref).abs()  # [T, D]
        assert (err <= fp16_h_bound(x, routes, experts) + 1e-5 * ref.abs().max()).all()
        assert rel_err(out, base, ref) > 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_matches_reference_and_padding_is_inert(triton_mods, experts, dtype):
    """One launch over 4 tokens: expert 0 has 3 routes, 1 and 2 one each, 3 none; 3 slots pad."""
    tx, _, decode = triton_mods
    g = torch.Generator().manual_seed(1)
    T = 4  # token 3 gets no valid route; the padding routes point at it
    ids = torch.tensor([[0, 2], [1, 0], [0, -1], [-1, -1]])
    routes = group_routes(ids, torch.rand(T, 2, generator=g), E)
    R = routes.token.numel()
    slot = torch.full((K,), -1, dtype=torch.int32)
    token = torch.full((K,), 3, dtype=torch.int32)
    weight = torch.full((K,), 1.0)
    slot[:R] = torch.repeat_interleave(torch.arange(E), routes.counts()).int()
    token[:R], weight[:R] = routes.token.int(), routes.weight
    x = torch.randn(T, D, generator=g).to(dtype)
    base = torch.randn(T, D, generator=g)
    h = torch.full((K, I), float("nan"))
    out = tx.decode_experts(decode, x, slot, token, weight, tx.HotPool.stack(experts), base.clone(), h)
    ref = moe_experts_reference(x.float(), routes, experts, torch.zeros(T, D))
    assert rel_err(out, base, ref) <= 1e-5
    assert torch.equal(out[3], base[3])  # padding routes added nothing
    assert torch.isfinite(h[:R]).all() and torch.isnan(h[R:]).all()  # and wrote no scratch


DX = 192  # the next test's hidden size: scale rows of 6 bytes, so scale words straddle rows


@pytest.fixture(scope="module")
def unclamped_prefill(triton_mods, kernel_dir):
    """A prefill module with SwiGLU's limit out of reach (3e38), hidden size DX."""
    params = TritonExpertParams(DX, I, "prefill", swiglu_limit=3e38, block_m=16, block_n=32, block_k=64)
    return triton_mods[0].load_triton_module(render_triton_experts(params, kernel_dir).path)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # silu(g) for g << 0: exp(-g) = inf, g / inf = -0
def test_every_code_and_scale_byte_decodes_exactly(triton_mods, unclamped_prefill):
    """Identity activations read the weights out one by one: with x = I (float32), gate/up's g and u
    are w1^T and w3^T (one product per sum), so h = silu(w1^T) * w3^T, for every weight. Random bytes
    cover all 16 codes; w1's scale bytes run through 0 (2^-127, a denormal) .. 248 (up to 6 x 2^121,
    so h stays finite); w3's stay near 1 so that h does not underflow. (255, NaN, would not show:
    SwiGLU's min/max drop a NaN.)"""
    tx, pre = triton_mods[0], unclamped_prefill
    e = random_packed_expert(DX, I, torch.Generator().manual_seed(2), scale_lo=126, scale_hi=128)
    w1_scale = torch.arange(I * DX // 32).remainder(249).to(torch.uint8).reshape(I, DX // 32)
    e = type(e)(e.w1, w1_scale.view(e.w1_scale.dtype), e.w3, e.w3_scale, e.w2, e.w2_scale)
    pool, tok, h = tx.HotPool.stack([e]), torch.arange(DX), torch.zeros(DX, I)
    slot, start, end = tx.route_blocks(group_routes(torch.zeros(DX, 1, dtype=torch.long), torch.ones(DX, 1), 1),
                                       pre.BLOCK_M)  # one expert, route t = token t
    pre.gate_up_kernel[(slot.numel(), I // pre.BLOCK_N)](torch.eye(DX), pool.w1, pool.w1_scale, pool.w3,
                                                        pool.w3_scale, h, tok, slot, start, end)
    w1, w3, _ = dequantize_expert(e)
    g, u = w1.T.clamp(max=pre.LIMIT), w3.T.clamp(-pre.LIMIT, pre.LIMIT)  # [DX, I]
    ref = g / (1 + torch.exp(-g)) * u  # the kernel's SwiGLU formula: silu's rounding is not under test
    assert (w1.abs() > 2.0 ** 123).any() and ((w1 != 0) & (w1.abs() < 2.0 ** -126)).any()
    torch.testing.assert_close(h, ref, rtol=1e-6, atol=0)


def test_engine_path_runs_cpu_bf16_as_float32(triton_mods, experts):
    """TritonPoolCompute, the engine's caller: bf16 activations on the CPU go in as float32 (the
    interpreter computes bf16 wrongly); on a GPU they would stay bf16 (tests/test_triton_targets.py)."""
    from ostinato.runtime.engine.hot_compute import TritonPoolCompute

    tx, prefill, decode = triton_mods
    g = torch.Generator().manual_seed(3)
    token, slot = torch.tensor([0, 0, 1, 2, 2]), torch.tensor([0, 1, 1, 0, 3])
    weight, x, base = (torch.rand(5, generator=g), torch.randn(3, D, generator=g).bfloat16(),
                       torch.randn(3, D, generator=g))
    out = base.clone()
    TritonPoolCompute(prefill, decode).prefill(tx.HotPool.stack(experts), x, token, slot, weight, out)
    ref = moe_experts_reference(x.float(), group_flat_routes(token, slot, weight, E), experts, torch.zeros(3, D))
    assert rel_err(out, base, ref) <= 1e-5


def test_decode_rejects_wrong_route_count(triton_mods, experts):
    tx, _, decode = triton_mods
    with pytest.raises(ValueError, match="decode launch needs"):
        tx.decode_experts(decode, torch.zeros(1, D), torch.zeros(3, dtype=torch.int32),
                          torch.zeros(3, dtype=torch.int32), torch.zeros(3), tx.HotPool.stack(experts),
                          torch.zeros(1, D), torch.zeros(3, I))


def test_variant_mismatch_is_rejected(triton_mods, experts):
    tx, prefill, _ = triton_mods
    with pytest.raises(ValueError, match="prefill"):
        tx.decode_experts(prefill, torch.zeros(1, D), *(torch.zeros(K) for _ in range(3)),
                          tx.HotPool.stack(experts), torch.zeros(1, D), torch.zeros(K, I))
