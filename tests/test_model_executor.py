"""The expert-executor contract, the routing observer, loading without experts, and the runtime's
import boundary (no transformers, compiler or jinja2)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ostinato.runtime import load_model
from ostinato.runtime.model import DenseExpertExecutor


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    return load_model(tiny_ckpt, dtype=torch.float32)


class Recording:
    """Wraps an executor, checks every call against the contract and optionally scales the output."""

    def __init__(self, inner, cfg, factor: float = 1.0):
        self.inner, self.cfg, self.factor, self.calls = inner, cfg, factor, []

    def __call__(self, layer, x, expert_ids, weights):
        t, k = x.shape[0], self.cfg.num_experts_per_tok
        assert x.shape == (t, self.cfg.hidden_size) and x.dtype == torch.float32
        assert expert_ids.shape == (t, k) and expert_ids.dtype == torch.int64
        assert weights.shape == (t, k) and weights.dtype == torch.float32
        assert int(expert_ids.min()) >= 0 and int(expert_ids.max()) < self.cfg.n_routed_experts
        # normalized, then multiplied by routed_scaling_factor
        torch.testing.assert_close(weights.sum(-1), torch.full((t,), self.cfg.routed_scaling_factor))
        self.calls.append((layer, t))
        out = self.inner(layer, x, expert_ids, weights)
        assert out.shape == x.shape
        return out * self.factor


def test_custom_executor_is_called_and_its_output_used(model):
    cfg, ids = model.config, torch.arange(40) * 7 % model.config.vocab_size
    dense = model.executor
    expected = model.new_session().prefill(ids)
    try:
        rec = Recording(dense, cfg)
        model.set_executor(rec)
        same = model.new_session().prefill(ids)
        assert [layer for layer, _ in rec.calls] == list(range(cfg.num_hidden_layers))
        assert all(t == 40 for _, t in rec.calls)
        torch.testing.assert_close(same, expected, rtol=0, atol=0)
        s = model.new_session()
        s.prefill(ids[:5])
        rec.calls.clear()
        s.decode(3)
        assert rec.calls == [(layer, 1) for layer in range(cfg.num_hidden_layers)]
        model.set_executor(Recording(dense, cfg, factor=2.0))  # its output must flow into the logits
        doubled = model.new_session().prefill(ids)
        assert (doubled - expected).abs().max() > 1e-2
    finally:
        model.set_executor(dense)


def test_plain_executor_matches_per_route_loop(model):
    """The grouped executor against the definition: sum_k w_k * expert_k(x), one route at a time."""
    ex: DenseExpertExecutor = model.executor
    g = torch.Generator().manual_seed(0)
    cfg = model.config
    x = torch.randn(9, cfg.hidden_size, generator=g)
    ids = torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[:cfg.num_experts_per_tok] for _ in range(9)])
    w = torch.rand(9, cfg.num_experts_per_tok, generator=g)
    got = ex(1, x, ids, w)
    want = torch.zeros_like(x)
    for t in range(9):
        for j in range(cfg.num_experts_per_tok):
            e = int(ids[t, j])
            gate, up = (ex.w13[1][e] @ x[t]).chunk(2)
            h = torch.nn.functional.silu(gate.clamp(max=cfg.swiglu_limit)) * up.clamp(-cfg.swiglu_limit,
                                                                                     cfg.swiglu_limit)
            want[t] += w[t, j] * (ex.w2[1][e] @ h)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_load_with_custom_executor_skips_experts(tiny_ckpt, model):
    rec = Recording(model.executor, model.config)
    m2 = load_model(tiny_ckpt, dtype=torch.float32, executor=rec)
    assert m2.executor is rec
    ids = torch.arange(20)
    torch.testing.assert_close(m2.new_session().prefill(ids), model.new_session().prefill(ids), rtol=0, atol=0)


def test_routing_observer(model):
    cfg, ids = model.config, torch.arange(30) * 11 % model.config.vocab_size
    seen = {}
    model.set_observer(lambda layer, tok, experts: seen.setdefault(layer, []).append((tok.clone(), experts.clone())))
    try:
        model.new_session().prefill(ids)
    finally:
        model.set_observer(None)
    assert sorted(seen) == list(range(cfg.num_hidden_layers))
    for layer, [(tok, experts)] in seen.items():
        assert torch.equal(tok, ids) and experts.shape == (30, cfg.num_experts_per_tok)
        if cfg.is_hash_layer(layer):  # hash layers route by token id
            table = model.weights.layers[layer].moe.router.tid2eid
            assert torch.equal(experts, table[ids])


@pytest.mark.slow  # a fresh interpreter importing the runtime, seconds
def test_runtime_does_not_import_reference_or_compiler(tiny_ckpt):
    code = ("import sys, torch; from ostinato.runtime import load_model; "
            f"load_model({str(tiny_ckpt)!r}).new_session().prefill(torch.arange(8)); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('transformers', 'jinja2') "
            "or m.startswith('ostinato.compiler')]; print(bad); assert not bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
