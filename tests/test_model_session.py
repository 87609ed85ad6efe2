"""Sessions on our model alone: truncation cost and correctness with a new continuation, fork
independence, and cache memory per token as docs/model.md section 4 sizes it."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to_scale

from ostinato.runtime import load_model

TOL = 1e-4


def assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert_close_to_scale(ours, ref, TOL, what)


# the small preset's cases are slow: its dimensions make each prefill several times the tiny one's
@pytest.fixture(scope="module", params=["tiny", pytest.param("small", marks=pytest.mark.slow)])
def model(request, tiny_ckpt, small_ckpt):
    return load_model(tiny_ckpt if request.param == "tiny" else small_ckpt, dtype=torch.float32)


def _tokens(model, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


class TokenCounter:
    """Routing observer counting the tokens layer 0 processes: what a truncation re-prefills."""

    def __init__(self):
        self.n = 0

    def __call__(self, layer, token_ids, expert_ids):
        if layer == 0:
            self.n += token_ids.numel()


@pytest.mark.parametrize("n,expected_rerun", [(150, 0), (170, 20), (100, 100), (212, 12)])
def test_truncate_then_new_continuation_equals_fresh_run(model, n, expected_rerun):
    first, second = _tokens(model, 150, 1), _tokens(model, 50, 2)  # turn 1 = 150 tokens, turn 2 = 50
    reply, new = _tokens(model, 15, 3), _tokens(model, 70, 4)
    session = model.new_session()
    session.prefill(first)
    session.prefill(second)
    for t in reply:
        session.decode(t)
    history = torch.cat((first, second, reply))
    counter = TokenCounter()
    model.set_observer(counter)
    try:
        session.truncate(n)
    finally:
        model.set_observer(None)
    # The cost is the distance back to the nearest snapshot (turn ends at 150 and 200), not n.
    assert counter.n == expected_rerun, f"truncate({n}) re-ran {counter.n} tokens, expected {expected_rerun}"
    assert session.tokens == history[:n].tolist()
    got = session.prefill(new)
    fresh = model.new_session().prefill(torch.cat((history[:n], new)))[n:]
    assert_close(got, fresh, f"truncate({n}) + new tokens vs a fresh run")
    assert_close(session.decode(7), model.new_session().prefill(torch.cat((history[:n], new, torch.tensor([7]))))[-1],
                 f"decode after truncate({n})")


def test_truncate_bounds(model):
    session = model.new_session()
    session.prefill(_tokens(model, 10, 5))
    with pytest.raises(ValueError, match="holds 10 tokens"):
        session.truncate(11)
    session.truncate(10)  # a no-op
    assert len(session) == 10


def test_forks_diverge_independently(model):
    base = model.new_session()
    prompt = _tokens(model, 140, 6)
    base.prefill(prompt)
    a, b = base.fork(), base.fork()
    ta, tb = _tokens(model, 30, 7), _tokens(model, 30, 8)
    la = torch.stack([a.decode(t) for t in ta])
    lb = b.prefill(tb)
    assert_close(la, model.new_session().prefill(torch.cat((prompt, ta)))[140:], "fork a (decoded)")
    assert_close(lb, model.new_session().prefill(torch.cat((prompt, tb)))[140:], "fork b (prefilled)")
    assert len(base) == 140 and base.cache.position == 140
    assert not torch.equal(la, lb)


def test_cache_memory_per_token(model):
    """Growing state = hd/m values per token in CSA and HCA layers + dI/4 in CSA layers; the rest is
    constant (windows of W-1 rows, partial compressor windows) whatever the length."""
    cfg = model.config
    s = model.new_session()
    sizes = {}
    for n in (300, 556):  # same phase in both 4- and 128-windows: constant parts comparable
        s.prefill(_tokens(model, n - len(s), n))
        sizes[n] = s.cache.nbytes
    elt = 4  # float32 cache
    per_token = sum((cfg.head_dim + (cfg.index_head_dim if cfg.compress_ratio(i) == 4 else 0)) / cfg.compress_ratio(i)
                    for i in range(cfg.num_hidden_layers) if cfg.compress_ratio(i))
    for n, size in sizes.items():
        expected = sum((n // cfg.compress_ratio(i)) * (cfg.head_dim + (cfg.index_head_dim if cfg.compress_ratio(i) == 4
                                                                        else 0))
                       for i in range(cfg.num_hidden_layers) if cfg.compress_ratio(i)) * elt
        assert size["growing"] == expected, (n, size, expected)
    assert sizes[300]["constant"] == sizes[556]["constant"]
    window_bytes = cfg.num_hidden_layers * (cfg.sliding_window - 1) * cfg.head_dim * elt
    assert sizes[556]["constant"] >= window_bytes
    assert (sizes[556]["growing"] - sizes[300]["growing"]) == 256 * per_token * elt
