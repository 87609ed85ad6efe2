"""The fixed-shape decode step (runtime/model/static_decode) against the dynamic model, float32.

Exactness: after a dynamic prefill, static steps give the logits of Session.decode, across CSA (4)
and HCA (128) window boundaries and, on "small" (index_topk 64), with the indexer really selecting
(> 256 tokens). Round trips: store() hands the cache back so dynamic prefill continues exactly;
load + store alone change nothing. Graph safety: every segment's ops and shapes are the same at
every position, none reads device data on the host or touches another segment's buffers
(tests/graph_safety.py). max_context errors.
"""

from __future__ import annotations

import pytest
import torch
from graph_safety import GraphUnsafe, first_difference, graph_safe_trace, segment_owners, traced_step
from static_helpers import MAX_CONTEXT, _cache_items, _tokens, assert_close

from ostinato.runtime import load_model
from ostinato.runtime.model.experts import swiglu
from ostinato.runtime.model.static_decode import StaticStep

# the `model` fixture (tiny and small, float32) is tests/conftest.py's, shared with test_static_buckets.py

# Prefill lengths with a decode of N tokens that crosses CSA and HCA boundaries (128 on tiny,
# 384 on small, where the indexer keeps 64 of ~95 visible entries).
LONG = {"tiny": (120, 16), "small": (370, 20)}


def static_decode(step: StaticStep, tokens) -> torch.Tensor:
    """Feed tokens one by one -> logits [N, V]."""
    out = []
    for t in tokens:
        step.set_tokens([int(t)])
        out.append(step.run().clone())
    return torch.stack(out)


class RouteRecorder:
    """Routing observer keeping the last forward's expert ids per layer."""

    def __init__(self):
        self.ids = {}

    def __call__(self, layer, token_ids, expert_ids):
        self.ids[layer] = expert_ids[-1].sort().values


@pytest.mark.parametrize("length", ["empty", "one", "long"])
def test_decode_matches_dynamic(model, length):
    p, n = {"empty": (0, 6), "one": (1, 8), "long": LONG[model.preset]}[length]
    ids = _tokens(model, p + n, 10)
    session = model.new_session()
    session.prefill(ids[:p])
    step = StaticStep(model, MAX_CONTEXT)
    step.load(session.cache)
    recorder = RouteRecorder()
    model.set_observer(recorder)
    try:
        for i, t in enumerate(ids[p:]):
            ref = session.decode(t)  # the dynamic reference; step.load took a copy of the cache before
            step.set_tokens([int(t)])
            assert_close(step.run(), ref, f"{model.preset}: token {i} at position {p + i}")
            got_ids, got_weights = (r[:, 0] for r in step.routes())  # [L, 1, k] -> [L, k]
            assert torch.equal(got_ids.sort(dim=-1).values,
                               torch.stack([recorder.ids[k] for k in sorted(recorder.ids)]))
            assert torch.allclose(got_weights.sum(dim=-1),
                                  torch.full((len(got_ids),), model.config.routed_scaling_factor))
    finally:
        model.set_observer(None)
    assert step.steps_taken == n and step.position == p + n


def test_store_then_dynamic_prefill_continues_exactly(model):
    p, n = LONG[model.preset][0] + 10, 10
    first, decoded, more = _tokens(model, p, 1), _tokens(model, n, 2), _tokens(model, 30, 3)
    ref = model.new_session()
    ref.prefill(first)
    ref_decoded = torch.stack([ref.decode(t) for t in decoded])
    ref_more = ref.prefill(more)

    session = model.new_session()
    session.prefill(first)
    step = StaticStep(model, MAX_CONTEXT)
    step.load(session.cache)
    assert_close(static_decode(step, decoded[:6]), ref_decoded[:6], "static decode")
    step.store(session.cache)  # mid-way: the buffers stay valid, decoding goes on without a reload
    assert_close(static_decode(step, decoded[6:]), ref_decoded[6:], "static decode after store()")
    step.store(session.cache)
    session.tokens.extend(decoded.tolist())
    with pytest.raises(ValueError, match="load it again"):
        step.store(model.new_session().cache)  # not the cache these buffers were synced with
    assert_close(session.prefill(more), ref_more, "dynamic prefill after store()")
    assert session.cache.nbytes == ref.cache.nbytes and session.cache.position == ref.cache.position

    step.load(session.cache)  # and static again after the dynamic prefill
    last = _tokens(model, 3, 4)
    assert_close(static_decode(step, last), torch.stack([ref.decode(t) for t in last]), "static decode after reload")


@pytest.mark.parametrize("p", [0, 2, 131])
def test_load_store_without_steps_keeps_the_cache(model, p):
    session = model.new_session()
    session.prefill(_tokens(model, p, 5))
    before = _cache_items(session.cache.clone())
    step = StaticStep(model, MAX_CONTEXT)
    step.load(session.cache)
    step.store(session.cache)
    after = _cache_items(session.cache)
    assert before.keys() == after.keys()
    for key, value in before.items():
        same = value == after[key] if not isinstance(value, torch.Tensor) else (
            after[key] is not None and value.shape == after[key].shape and torch.equal(value, after[key]))
        assert same, f"position {p}: {key} changed"


@pytest.mark.slow  # 40 decode steps each way, seconds
def test_greedy_tokens_match_dynamic(model):
    """40 greedy steps; on small they cross the indexer's selection onset (256 tokens)."""
    session = model.new_session()
    logits = session.prefill(_tokens(model, {"tiny": 100, "small": 250}[model.preset], 6))[-1]
    step = StaticStep(model, MAX_CONTEXT)
    step.load(session.cache)
    ref_logits, ours = logits, logits
    ref_tokens, our_tokens = [], []
    for _ in range(40):
        ref_tokens.append(int(ref_logits.argmax()))
        our_tokens.append(int(ours.argmax()))
        ref_logits = session.decode(ref_tokens[-1])
        step.set_tokens([our_tokens[-1]])
        ours = step.run()
    assert our_tokens == ref_tokens


@pytest.mark.parametrize("p, n", [(120, 16), ("long", 0)])
def test_a_step_within_a_smaller_context_equals_the_dynamic_model(model, p, n):
    """Decode with a step that reads only the rows of a smaller context (StaticStep.within) until the next
    token no longer fits, then with the full step, as the engine does: the dynamic model's logits. At
    (120, 16) the first step holds 128 tokens, so its indexer keeps at most 32 rows (fewer than small's
    index_topk 64); at "long" on small the indexer really selects."""
    if p == "long":
        p, n = LONG[model.preset]
    ids = _tokens(model, p + n, 11)
    session, reference = model.new_session(), model.new_session()
    session.prefill(ids[:p])
    reference.prefill(ids[:p])
    full = StaticStep(model, MAX_CONTEXT)
    small = full.within(p + n // 2)
    assert small.context == p + n // 2 and small.state is full.state and small.logits is full.logits
    full.load(session.cache)
    for i, t in enumerate(ids[p:]):
        step = small if full.position < small.context else full
        step.set_tokens([int(t)])
        assert_close(step.run(), reference.decode(t), f"{model.preset}: token {i} at position {p + i}, "
                     f"context {step.context}")
    with pytest.raises(ValueError, match=f"max_context={p + n // 2}"):
        small.check_room()
    with pytest.raises(ValueError, match="1..max_context"):
        full.within(MAX_CONTEXT + 1)
    full.store(session.cache)  # what both steps wrote is in the one state: what the full step alone writes
    plain = model.new_session()
    plain.prefill(ids[:p])
    full.load(plain.cache)
    static_decode(full, ids[p:])
    full.store(plain.cache)
    assert session.cache.position == plain.cache.position == p + n
    for i, (a, b) in enumerate(zip(session.cache.layers, plain.cache.layers)):  # equal up to the attention's
        rows = [(x.view(), y.view()) for x, y in ((a.rows, b.rows), (a.index_rows, b.index_rows)) if x is not None]
        for x, y in [(a.window, b.window)] + rows:  # summation order
            assert_close(x, y, f"layer {i}'s cache")


def test_max_context(model):
    session = model.new_session()
    session.prefill(_tokens(model, 9, 8))
    step = StaticStep(model, 10)
    step.load(session.cache)
    step.set_tokens([1])
    step.run()  # position 9 -> a context of 10: the limit
    with pytest.raises(ValueError, match="max_context=10"):
        step.run()
    assert step.position == 10
    session.prefill(_tokens(model, 2, 9))
    with pytest.raises(ValueError, match="max_context=10"):
        step.load(session.cache)


def test_store_detects_a_step_the_host_did_not_count(model):
    """A graph runner replays segments and must call note_step(); store() checks the device positions."""
    session = model.new_session()
    session.prefill(_tokens(model, 5, 12))
    step = StaticStep(model, MAX_CONTEXT)
    step.load(session.cache)
    step.run_segment(0)  # one segment, no note_step()
    with pytest.raises(RuntimeError, match="note_step"):
        step.store(session.cache)


class GatheredExperts:
    """Test executor: the dense one for prefill, plus a fixed-shape decode_step (the k experts' weights
    gathered with index_select, batched matmuls) where the dense one reads counts on the host."""

    def __init__(self, dense):
        self.dense = dense

    def __call__(self, layer, x, expert_ids, weights):
        return self.dense(layer, x, expert_ids, weights)

    def decode_step(self, layer, x, expert_ids, weights):
        """x [1, D], expert_ids [1, k], weights [1, k] -> [1, D]."""
        k = expert_ids.shape[1]
        w13 = self.dense.w13[layer].index_select(0, expert_ids[0])  # [k, 2I, D]
        w2 = self.dense.w2[layer].index_select(0, expert_ids[0])  # [k, D, I]
        h = swiglu(torch.bmm(x.expand(k, -1).unsqueeze(1), w13.transpose(1, 2)), self.dense.limit)  # [k, 1, I]
        out = torch.bmm(h, w2.transpose(1, 2))[:, 0].float()  # [k, D]
        return (out * weights[0, :, None]).sum(dim=0, keepdim=True).to(x.dtype)  # [1, D]


@pytest.fixture(scope="module")
def pipelined(tiny_ckpt):
    """Tiny model split in two segments on the CPU ("cpu" and "cpu:0" are different device names)."""
    m = load_model(tiny_ckpt, dtype=torch.float32, layer_devices=["cpu", "cpu", "cpu:0", "cpu:0"])
    m.set_executor(GatheredExperts(m.executor))
    return m


def test_segments_are_graph_safe_with_fixed_shapes(pipelined):
    ids = _tokens(pipelined, 130, 11)
    session = pipelined.new_session()
    session.prefill(ids[:127])
    step = StaticStep(pipelined, MAX_CONTEXT)
    assert [tuple(s) for s in step.segments] == [(torch.device("cpu"), 0, 2), (torch.device("cpu", 0), 2, 4)]
    step.load(session.cache)
    owners, traces = segment_owners(step), []
    for t in ids[127:129]:  # position 127 completes a CSA and the first HCA window; 128 opens new ones
        traces.append(traced_step(step, [int(t)], owners))  # each segment touching only its own buffers
        assert_close(step.logits, session.decode(t), "two segments, gathered experts")
    for i in range(len(step.segments)):
        assert traces[0][i], "nothing traced"
        diff = first_difference(traces[0][i], traces[1][i])
        assert diff is None, f"segment {i}: ops differ between positions 127 and 128: {diff}"


def test_checker_catches_host_reads(model):
    """The plain DenseExpertExecutor reads per-expert counts on the host: not capturable."""
    step = StaticStep(model, MAX_CONTEXT)
    with pytest.raises(GraphUnsafe, match="_local_scalar_dense|bincount"):
        graph_safe_trace(step.run_segment, 0)
    x = torch.arange(6)
    for bad in (lambda: x[x > 2], lambda: int(x[0]), lambda: x.nonzero(), lambda: torch.unique(x),
                lambda: torch.repeat_interleave(x, x), lambda: torch.tensor([1, 2])):
        with pytest.raises(GraphUnsafe):
            graph_safe_trace(bad)
    assert graph_safe_trace(lambda: x.index_select(0, x[:2]).topk(1))  # fixed shapes: recorded, no error


def test_indexer_ties_go_to_the_earlier_entry_in_both_paths():
    """An exact tie at the k-th place has one answer, the same in the dynamic and the static selection."""
    from ostinato.runtime.model.indexer import select, top_k_earliest
    from ostinato.runtime.model.static_decode.indexer import select_fixed

    scores = torch.tensor([[0.0, 2.0, 1.0, 1.0, 0.0, 1.0, 3.0, 1.0]])
    assert top_k_earliest(scores, 4).tolist() == [[6, 1, 2, 3]]      # 1.0 ties at 2, 3, 5, 7: 2 and 3 win
    assert top_k_earliest(scores, 6).tolist() == [[6, 1, 2, 3, 5, 7]]
    # through both selections: one query head of weight 1, keys chosen so relu(q . key) = the scores above
    n, d = scores.shape[1], 4
    keys = torch.zeros(n, d)
    keys[:, 0] = scores[0] * d ** 0.5
    q, weights = torch.zeros(1, 1, d), torch.ones(1, 1)
    q[0, 0, 0] = 1.0
    position = torch.tensor([4 * n - 1])  # every entry visible (ratio 4)
    dynamic = select(q, weights, keys, position, ratio=4, topk=4)
    fixed, keep = select_fixed(q, weights, torch.cat((keys, torch.zeros(3, d))), torch.arange(n + 3),
                               torch.tensor([n]), topk=4)
    assert dynamic.tolist() == fixed.tolist() == [[6, 1, 2, 3]] and keep.all()
