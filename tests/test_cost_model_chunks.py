"""A prompt longer than the plan's prefill chunk is priced as the runtime runs it (#57): one forward per chunk, each
at its own position, every chunk in the mode chosen for the whole prompt (runtime/model/session.py chunks it,
runtime/engine/session.py picks the mode from its length). Each chunk uploads its own distinct cold experts,
exchanges its own tokens' activations and attends to the rows visible at its own end, so the one-link and the
sharded upload of a 16,384-token prompt compare as four 4,096-token forwards, not as one forward of 16,384.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_shard_plan import v4_cost

from ostinato.hardware import load_hardware

CHUNK = 4096  # the plan's default policy.prefill_chunk (CostModel's default too)
AT = 20_282   # the V4-Flash plan's predictions position (agent_turns.csv's median cached prefix)


@pytest.fixture(scope="module")
def cost():
    """V4-Flash on rtx4090d-x4 (4 GPUs: all three modes), 64 hot experts a layer, context 65,536."""
    c = v4_cost(load_hardware("rtx4090d-x4"))
    assert c.prefill_chunk == CHUNK and c.shards == 4
    return c


def modes(c):
    return {"split": c.split_prefill, "upload": c.upload_prefill, "sharded": c.sharded_prefill}


@pytest.mark.parametrize("mode", ["split", "upload", "sharded"])
def test_a_16k_prompt_is_four_chunk_forwards_at_their_positions(cost, mode):
    """16,384 tokens after AT cost four 4,096-token forwards after AT, AT + 4,096, ... (each priced alone, within
    one chunk); a prompt that ends in a shorter chunk, that one too; a prompt within one chunk is one forward."""
    prompt = modes(cost)[mode]
    chunks = [prompt(CHUNK, AT + i * CHUNK) for i in range(4)]
    assert prompt(4 * CHUNK, AT) == pytest.approx(sum(chunks), rel=1e-12)
    assert prompt(CHUNK + 10, AT) == pytest.approx(prompt(CHUNK, AT) + prompt(10, AT + CHUNK), rel=1e-12)
    # later chunks attend to more rows: not one chunk's price four times
    assert chunks[0] < chunks[1] < chunks[2] < chunks[3]
    forward = {"split": cost.split_forward, "upload": cost.upload_forward, "sharded": cost.sharded_forward}[mode]
    assert prompt(CHUNK, AT) == forward(CHUNK, AT) and prompt(100, None) == forward(100, None)


def test_each_chunk_uploads_its_own_cold_experts_once(cost):
    """The single-link upload of a 2-chunk prompt moves the layers' distinct cold experts of each chunk: twice a
    chunk's, not once the distinct experts of the whole prompt (which, at 8,192 tokens, are nearly the same)."""
    per_chunk = sum(cost.upload_time(cost.distinct(l, CHUNK, False)) for l in range(len(cost.layers)))
    whole = sum(cost.upload_time(cost.distinct(l, 2 * CHUNK, False)) for l in range(len(cost.layers)))
    assert whole < 1.01 * per_chunk   # almost every cold expert is touched by one chunk already
    # double-buffered, every upload is exposed or hidden under a compute no shorter: the prompt takes at least them
    assert cost.upload_prefill(2 * CHUNK, AT) > 2 * per_chunk > 1.9 * whole


def test_chunks_start_at_the_prompts_position_or_the_end_of_the_context(cost):
    assert cost.prefill_chunks(10_000, AT) == [(CHUNK, AT), (CHUNK, AT + CHUNK), (1808, AT + 2 * CHUNK)]
    ctx = cost.context  # None: the prompt ends at the end of the plan's context
    assert cost.prefill_chunks(10_000, None) == [(CHUNK, ctx - 10_000), (CHUNK, ctx - 10_000 + CHUNK),
                                                 (1808, ctx - 10_000 + 2 * CHUNK)]
    assert cost.prefill_chunks(CHUNK, None) == [(CHUNK, None)]
    assert cost.split_prefill(10_000) == pytest.approx(
        sum(cost.split_prefill(t, p) for t, p in cost.prefill_chunks(10_000, None)), rel=1e-12)


def test_the_whole_prompts_mode_runs_every_chunk(cost):
    """The runtime chooses a prompt's mode from its length (engine/session.py prefill_mode) and runs every chunk in
    it: a prompt of one chunk and 10 tokens past the upload threshold uploads its 10-token tail too, and one past
    the shard threshold shards it; bucket steps only for a whole prompt within the largest bucket."""
    n, t, s = CHUNK + 10, 100, 1000
    assert cost.eager_mode(n, t, None) == "upload" and cost.eager_mode(10, t, None) == "split"
    upload_tail = cost.upload_prefill(CHUNK, AT) + cost.upload_prefill(10, AT + CHUNK)
    assert cost.eager_prefill(n, t, AT) == pytest.approx(upload_tail, rel=1e-12)
    assert cost.upload_prefill(10, AT + CHUNK) != pytest.approx(cost.split_prefill(10, AT + CHUNK), rel=1e-3)
    sharded_tail = cost.sharded_prefill(CHUNK, AT) + cost.sharded_prefill(10, AT + CHUNK)
    assert cost.eager_prefill(n, t, AT, s) == pytest.approx(sharded_tail, rel=1e-12)
    assert cost.prefill(n, t, [2, 4, 8, 16], AT, s) == cost.eager_prefill(n, t, AT, s)


def test_a_16k_prompt_shards_its_uploads_where_each_chunk_does(cost):
    """Priced as one forward of 16,384 tokens, one link beat the sharded upload on this spec (the exchange grows
    with the forward's tokens, its uploads do not), so sharding "did not pay" at 16,384; in chunks, as it runs,
    each chunk shards faster than it uploads over one link, and so does the prompt."""
    assert cost.sharded_prefill(4 * CHUNK, AT) < cost.upload_prefill(4 * CHUNK, AT)
    assert cost.shard_crossover(AT, limit=4 * CHUNK) == cost.shard_crossover(AT) == 0
    chunk_gain = cost.upload_prefill(CHUNK, AT) - cost.sharded_prefill(CHUNK, AT)
    assert chunk_gain > 0


def test_the_crossovers_look_no_further_than_the_longest_prompt_the_plan_runs(cost):
    """A prompt cannot pass the plan's context (engine/session.py ContextFull): the crossovers search up to the
    context less the position, pricing each candidate in chunks."""
    assert cost.longest_prompt(None) == cost.context and cost.longest_prompt(AT) == cost.context - AT
    assert cost.longest_prompt(cost.context + 5) == 1
    split = np.array([cost.split_prefill(n, AT) for n in (CHUNK, 2 * CHUNK)])
    upload = np.array([cost.upload_prefill(n, AT) for n in (CHUNK, 2 * CHUNK)])
    x = cost.crossover(position=AT)
    assert x is not None and x < CHUNK and (upload < split).all()
    assert cost.split_prefill(x, AT) <= cost.upload_prefill(x, AT)
    assert cost.split_prefill(x + 1, AT) > cost.upload_prefill(x + 1, AT)
