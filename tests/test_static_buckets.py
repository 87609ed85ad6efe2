"""The fixed-shape step of T > 1 tokens (a short-prefill bucket) against the dynamic model, in float32.

A bucket step at position p must give the dynamic prefill's last-token logits, leave the static
buffers exactly as the dynamic cache would be (decode steps and a dynamic prefill after store() go on
exactly), and do so where its T tokens cross window, compressor (4 and 128) and indexer-selection
boundaries. The decomposition of a prompt into buckets (120 = 64 + 32 + 16 + 8) is exact too.
"""

import pytest
import torch
from static_helpers import MAX_CONTEXT, _cache_items, _tokens, assert_close

from ostinato.buckets import bucket_pieces
from ostinato.runtime.model.static_decode import StaticStep

# the `model` fixture (tiny and small, float32) is tests/conftest.py's, shared with test_static_decode.py

# (position, T): T tokens from position p, chosen to cross boundaries of the tiny (window 16, ratios
# 4 / 128, selection from 512) and small (window 32, ratios 4 / 128, selection from 256) presets.
CASES = [(0, 2), (0, 16), (3, 5), (13, 8), (30, 4), (60, 64), (121, 8), (100, 32), (127, 2), (250, 16), (240, 64)]


def _step(model, tokens: int, state=None) -> StaticStep:
    return StaticStep(model, MAX_CONTEXT, tokens=tokens, state=state)


@pytest.mark.parametrize("p, T", CASES)
def test_a_bucket_step_equals_the_dynamic_prefill(model, p, T):
    ids = _tokens(model, p + T + 3, 20 + p)
    ref = model.new_session()
    ref.prefill(ids[:p])
    session = ref.fork()
    step = _step(model, T)
    step.load(session.cache)
    step.set_tokens(ids[p:p + T])
    got = step.run()
    want = ref.prefill(ids[p:p + T])[-1]
    assert_close(got, want, f"{model.preset}: {T} tokens at position {p}")
    got_ids, got_weights = step.routes()
    assert got_ids.shape == (model.config.n_layers, T, model.config.num_experts_per_tok)
    assert torch.allclose(got_weights.sum(-1), torch.full(got_ids.shape[:2], model.config.routed_scaling_factor))

    decode = _step(model, 1, state=step.state)  # the decode step goes on from the bucket's state
    for t in ids[p + T:]:
        decode.set_tokens([int(t)])
        assert_close(decode.run(), ref.decode(t), f"{model.preset}: decode after {T} tokens at {p}")
    step.store(session.cache)
    ours, theirs = _cache_items(session.cache), _cache_items(ref.cache)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key] is not None and ours[key].shape == value.shape, key
            if value.numel():
                assert (ours[key] - value).abs().max() <= 1e-5 * value.abs().max().clamp(min=1e-30), key
        else:
            assert ours[key] == value, key


def test_a_prompt_as_bucket_pieces_equals_one_prefill(model):
    """120 tokens as 64 + 32 + 16 + 8 steps (and 7 as 4 + 2 + 1) after a context that puts them across
    the 128 compressor boundary."""
    buckets = [2, 4, 8, 16, 32, 64]
    assert bucket_pieces(120, buckets) == [64, 32, 16, 8] and bucket_pieces(7, buckets) == [4, 2, 1]
    ids = _tokens(model, 60 + 127, 31)
    ref = model.new_session()
    ref.prefill(ids[:60])
    session = ref.fork()
    steps = {T: _step(model, T) for T in (1, *buckets)}
    state = steps[1].state
    steps = {T: _step(model, T, state) if T > 1 else steps[1] for T in steps}
    steps[1].load(session.cache)
    done = 60
    for n in (120, 7):
        for T in bucket_pieces(n, buckets):
            steps[T].set_tokens(ids[done:done + T])
            logits = steps[T].run()
            done += T
        assert_close(logits, ref.prefill(ids[done - n:done])[-1], f"{model.preset}: {n} tokens as bucket pieces")
    assert state.position == 60 + 127


def test_wrong_token_count_and_context_are_refused(model):
    step = _step(model, 4)
    with pytest.raises(ValueError, match="takes 4 tokens, got 3"):
        step.set_tokens([1, 2, 3])
    small = StaticStep(model, 10, tokens=4)
    small.set_tokens([1, 2, 3, 4])
    small.run(), small.run()
    with pytest.raises(ValueError, match="max_context=10"):
        small.run()  # 8 + 4 > 10
    with pytest.raises(ValueError, match="max_context=512"):
        StaticStep(model, 10, state=step.state)
