"""bf16 products widened to float32 on CPUs without bf16 arithmetic (runtime/model/bf16_widening.py).

Both paths run on every host: the tests set NATIVE_BF16 themselves. Each widened product is checked
against a float64 reference of the same bf16 inputs on fresh random data: the result must be that exact
sum rounded to bf16, up to float32 accumulation (so within 2^-8 of each value, relative, plus a hair of
the scale), including slabs that split the matrix's rows unevenly.
"""

from __future__ import annotations

import pytest
import torch

from ostinato.runtime import load_model
from ostinato.runtime.model import bf16_widening as bw
from ostinato.runtime.model.fp8_matrix import grouped_linear, linear

BF16 = torch.bfloat16


def _close_to_exact(got: torch.Tensor, exact: torch.Tensor) -> None:
    assert got.dtype == BF16
    scale = float(exact.abs().max())
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -8, atol=1e-6 * scale)


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


@pytest.fixture
def no_bf16_arithmetic(monkeypatch):
    monkeypatch.setattr(bw, "NATIVE_BF16", False)


@pytest.mark.parametrize("T,K,N,slab", [(16, 64, 100, 64 * 7), (33, 128, 256, 1 << 20), (20, 96, 5, 96)])
def test_widened_linear_is_the_exact_sum_rounded(monkeypatch, T, K, N, slab):
    monkeypatch.setattr(bw, "SLAB_ELEMENTS", slab)  # 7 rows a slab: 100 rows in 15 slabs, the last of 2
    x, w = _rand(T, K, seed=T), _rand(N, K, seed=N)
    got = bw.widened_linear(x, w)
    assert got.shape == (T, N)
    _close_to_exact(got, x.double() @ w.double().T)


def test_widened_linear_keeps_leading_dims():
    x, w = _rand(2, 3, 17, 64, seed=1), _rand(40, 64, seed=2)
    got = bw.widened_linear(x, w)
    assert got.shape == (2, 3, 17, 40)
    _close_to_exact(got, x.double() @ w.double().T)


def test_widened_grouped_is_each_groups_product():
    G, T, K, M = 4, 18, 64, 24
    x, w = _rand(G, T, K, seed=3), _rand(G * M, K, seed=4)
    got = bw.widened_grouped(x, w)
    assert got.shape == (G, T, M)
    exact = torch.stack([x[g].double() @ w[g * M:(g + 1) * M].double().T for g in range(G)])
    _close_to_exact(got, exact)


@pytest.mark.parametrize("a_shape,b_shape", [((5, 8, 32), (5, 32, 12)), ((7, 4, 64), (64, 30)),
                                             ((1, 6, 16), (1, 16, 9))])
def test_product_widened_is_the_exact_sum_rounded(no_bf16_arithmetic, a_shape, b_shape):
    a, b = _rand(*a_shape, seed=5), _rand(*b_shape, seed=6)
    got = bw.product(a, b)
    _close_to_exact(got, torch.matmul(a.double(), b.double()))


def test_product_keeps_torchs_path_with_bf16_arithmetic_or_float32(monkeypatch):
    a, b = _rand(3, 4, 8, seed=7), _rand(3, 8, 5, seed=8)
    monkeypatch.setattr(bw, "NATIVE_BF16", True)
    assert torch.equal(bw.product(a, b), torch.matmul(a, b))
    monkeypatch.setattr(bw, "NATIVE_BF16", False)
    af, bf = a.float(), b.float()
    assert torch.equal(bw.product(af, bf), torch.matmul(af, bf))


def test_widens_from_the_measured_token_count_only_without_bf16_arithmetic(monkeypatch):
    w = _rand(32, 64, seed=9)
    few, many = _rand(bw.WIDEN_MIN_TOKENS - 1, 64, seed=10), _rand(bw.WIDEN_MIN_TOKENS, 64, seed=11)
    monkeypatch.setattr(bw, "NATIVE_BF16", False)
    assert bw.widens(many, w) and not bw.widens(few, w)
    assert not bw.widens(many.float(), w.float())  # float32 plans: torch's matmul
    monkeypatch.setattr(bw, "NATIVE_BF16", True)
    assert not bw.widens(many, w)


def test_linear_and_grouped_linear_take_the_widened_path(no_bf16_arithmetic):
    x, w = _rand(bw.WIDEN_MIN_TOKENS + 3, 64, seed=12), _rand(48, 64, seed=13)
    assert torch.equal(linear(x, w), bw.widened_linear(x, w))
    xg = _rand(2, bw.WIDEN_MIN_TOKENS, 64, seed=14)
    assert torch.equal(grouped_linear(xg, w), bw.widened_grouped(xg, w))
    one = x[:1]  # one token: torch's bf16 GEMV (bound by bytes, where bf16 wins)
    assert torch.equal(linear(one, w), one @ w.T)


def test_tiny_model_prefill_widened_against_torchs_bf16_and_float32(tiny_ckpt, monkeypatch):
    """The whole bf16 forward (projections, attention's products) both ways, and float32 as the reference:
    the two bf16 paths differ only in summation order and rounding points, so both sit within bf16's
    distance of float32 and pick float32's token where float32 has a clear winner."""
    b16 = load_model(tiny_ckpt, dtype=BF16)
    f32 = load_model(tiny_ckpt, dtype=torch.float32)
    ids = torch.randint(0, b16.config.vocab_size, (40,), generator=torch.Generator().manual_seed(15))
    reference = f32.new_session().prefill(ids)[-1]
    scale = float(reference.abs().max())
    for native in (True, False):
        monkeypatch.setattr(bw, "NATIVE_BF16", native)
        logits = b16.new_session().prefill(ids)[-1].float()
        assert float((logits - reference).abs().max()) <= 0.05 * scale, f"NATIVE_BF16={native}"
        top2 = reference.topk(2).values
        if float(top2[0] - top2[1]) >= 0.01 * scale:
            assert int(logits.argmax()) == int(reference.argmax()), f"NATIVE_BF16={native}"


@pytest.mark.parametrize("T,K,N,slab,align", [(16, 64, 100, 64 * 7, 1), (33, 128, 256, 1 << 20, 1),
                                               (20, 96, 260, 96 * 130, 128)])
def test_bf16_slab_product_is_the_exact_sum_rounded(monkeypatch, T, K, N, slab, align):
    """The slabs decoded to bf16 and multiplied by torch's bf16 GEMM (a host with bf16 arithmetic; it runs on
    any): each slab's [T, R] block lands in its columns, the last slab short, leading dims kept."""
    monkeypatch.setattr(bw, "SLAB_ELEMENTS", slab)  # (7 rows: 15 slabs, the last of 2), one slab, 128-row slabs
    x, w = _rand(2, T, K, seed=T), _rand(N, K, seed=N)
    filled = []

    def fill(r0, r1, part):
        assert part.dtype == BF16 and part.shape == (r1 - r0, K) and r0 % align == 0
        filled.append((r0, r1))
        part.copy_(w[r0:r1])

    got = bw.bf16_slab_product(x, N, fill, align=align)
    assert got.shape == (2, T, N)
    assert filled[0][0] == 0 and filled[-1][1] == N and all(a[1] == b[0] for a, b in zip(filled, filled[1:]))
    _close_to_exact(got, x.double() @ w.double().T)
