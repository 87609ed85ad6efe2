"""The session simulator cuts each system's prompts as that system does and prices the chunks as it runs them.

- Ostinato chooses a prompt's mode once from the whole prompt's length (runtime/engine/session.py prefill_mode) and
  runs every chunk of the plan's prefill chunk in it (runtime/model/session.py): a short tail chunk is no bucket
  step or split-route forward of its own, and the simulated prompt is the cost model's chunked price of it.
- KTransformers' forwards are SGLang's --chunked-prefill-size (2048 in its DeepSeek-V4-Flash recipe), each switching
  to the layerwise prefill when its own tokens reach --kt-gpu-prefill-token-threshold (kt_ep_wrapper: >=).
- llama.cpp's forwards are its physical batch -ub (512 by default): op offload decides per ubatch and every ubatch
  copies the host experts it uses.
- Every system is routed alike: the trace is drawn in pieces that add up to each system's chunks.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_shard_plan import v4_cost

from ostinato.bench.simulator import wait_terms as wt
from ostinato.bench.simulator.ktransformers import (
    DOCUMENTED_THRESHOLD,
    RECIPE_CHUNKED_PREFILL,
    KTransformers,
    best_threshold,
    uniform_placed,
)
from ostinato.bench.simulator.llamacpp import N_UBATCH, CpuExperts, LayerPlacement, LruCache
from ostinato.bench.simulator.ostinato_policy import Ostinato
from ostinato.bench.simulator.policy import Forward, Policy, bucket_pass, sharded_pass, split_pass, upload_pass
from ostinato.bench.simulator.replay import ROUTING_GRAIN, chunked_prefill, pieces, simulate
from ostinato.bench.simulator.trace import TraceSampler
from ostinato.hardware import load_hardware
from ostinato.workload import SessionShape, Turn

CHUNK = 4096           # the plan's default policy.prefill_chunk (CostModel's default too)
AT = 20_282            # a session's position: the V4-Flash plan's predictions position
THRESHOLD, BUCKETS = 100, [2, 4, 8, 16]


@pytest.fixture(scope="module")
def cost():
    """V4-Flash on rtx4090d-x4 (4 GPUs: every mode), the first 64 experts of every layer hot, routes even."""
    c = v4_cost(load_hardware("rtx4090d-x4"))
    assert c.prefill_chunk == CHUNK and c.shards == 4
    return c


def hot_of(c) -> np.ndarray:
    return np.stack([l.hot for l in c.layers])   # [L, E]


def even_counts(c, n: int) -> np.ndarray:
    """[L, E] n tokens' routes spread evenly, n * k / E to every expert (an integer for the sizes used): the cost
    model's expected routes, and every expert touched, its expected distinct experts at these sizes."""
    L, E, k = len(c.layers), c.cfg.n_routed_experts, c.cfg.num_experts_per_tok
    assert n * k % E == 0
    return np.full((L, E), n * k // E, dtype=np.int64)


# ----- Ostinato: the whole prompt's mode, every chunk ------------------------------------------------------------
@pytest.mark.parametrize("shard, mode", [(None, "upload"), (1000, "sharded")])
def test_a_4100_token_prompts_4_token_tail_runs_in_the_prompts_mode(cost, shard, mode):
    """4,100 tokens = a 4,096-token chunk and a 4-token tail. The plan runs both in the mode of 4,100 tokens
    (upload-once, or sharded past the shard threshold), as the cost model prices the prompt; the tail alone would
    have been 4 bucket steps' worth (a bucket step of 4), which the runtime does not run for a chunk."""
    pol = Ostinato(cost, hot_of(cost), THRESHOLD, BUCKETS, shard_threshold=shard)
    sampler = TraceSampler(np.stack([l.share for l in cost.layers]), cost.cfg.num_experts_per_tok, 3)
    first, tail = sampler.counts(CHUNK), sampler.counts(4)
    f = chunked_prefill(pol, [(first, CHUNK), (tail, 4)], AT)
    hot = pol.hot

    def priced(counts, n, at):
        if mode == "sharded":
            return sharded_pass(cost, counts, n, hot, at).seconds
        return upload_pass(cost, counts, n, (counts > 0) & ~hot, "upload", position=at).seconds
    assert f.mode == mode
    assert f.seconds == pytest.approx(priced(first, CHUNK, AT) + priced(tail, 4, AT + CHUNK), rel=1e-12)
    as_bucket = bucket_pass(cost, tail, 4, hot, BUCKETS, AT + CHUNK).seconds   # what a per-chunk choice priced
    assert abs(priced(tail, 4, AT + CHUNK) - as_bucket) > 0.1 * as_bucket
    assert pol.mode(4100) == cost.eager_mode(4100, THRESHOLD, shard) == mode and pol.mode(4) == "bucket"


def test_the_wait_breakdown_itemizes_a_prompts_chunks_in_the_prompts_mode(cost):
    """wait_terms.Itemized prices a prompt as the policy does (prefill_prompt), its terms those of the prompt's
    mode for every chunk: they add up to the policy's price."""
    pol = Ostinato(cost, hot_of(cost), THRESHOLD, BUCKETS, shard_threshold=1000)
    itemized = wt.Itemized(pol)
    itemized.reset()
    sampler = TraceSampler(np.stack([l.share for l in cost.layers]), cost.cfg.num_experts_per_tok, 4)
    passes = [(sampler.counts(CHUNK), CHUNK), (sampler.counts(4), 4)]
    f = itemized.prefill_prompt(passes, AT)
    assert f == pol.prefill_prompt(passes, AT) and f.mode == "sharded"
    assert wt.total(itemized.turns[-1][-1]) == pytest.approx(f.seconds, rel=1e-9)


def test_a_chunked_prompt_is_the_cost_models_chunked_price_of_it(cost):
    """5,120 tokens (4,096 + 1,024) past the shard threshold (4,500) with the expected routes: every chunk sharded,
    the cost model's own price of that prompt (CostModel.prefill, chunks.py), where pricing each chunk by its own
    length would have uploaded both over one link (neither passes 4,500)."""
    shard = 4500
    pol = Ostinato(cost, hot_of(cost), THRESHOLD, BUCKETS, shard_threshold=shard)
    passes = [(even_counts(cost, CHUNK), CHUNK), (even_counts(cost, 1024), 1024)]
    f = chunked_prefill(pol, passes, AT)
    expected = cost.prefill(5120, THRESHOLD, BUCKETS, AT, shard)
    assert expected == pytest.approx(cost.sharded_prefill(5120, AT), rel=1e-12)
    assert f.seconds == pytest.approx(expected, rel=1e-9)
    assert cost.upload_prefill(5120, AT) != pytest.approx(expected, rel=1e-3)   # the per-chunk choice differs


def test_a_prompt_within_the_upload_threshold_splits_whatever_the_shard_threshold(cost):
    """The runtime splits routes up to policy.prefill_threshold and shards only past both thresholds
    (prefill_mode): a shard threshold below the upload threshold does not shard a prompt that splits."""
    pol = Ostinato(cost, hot_of(cost), 1000, [], shard_threshold=0)
    counts = even_counts(cost, 512)
    f = pol.prefill(counts, 512, AT)
    assert f.mode == "split" and f.seconds == split_pass(cost, counts, 512, pol.hot, position=AT).seconds
    assert pol.mode(512) == "split" and pol.mode(1001) == "sharded"


# ----- each system's own chunk -----------------------------------------------------------------------------------
class Recording(Policy):
    """Records every forward it is asked to price: (tokens, position, routes)."""

    def __init__(self, cost, chunk: int, name: str, reuses_prefix: bool = True):
        super().__init__(cost)
        self.chunk, self.name, self.reuses_prefix = chunk, name, reuses_prefix
        self.forwards: list[tuple[int, int, np.ndarray]] = []

    @property
    def prefill_chunk(self) -> int:
        return self.chunk

    def prefill(self, counts, n, position=0):
        self.forwards.append((n, position, counts))
        return Forward(0.0)

    def decode(self, ids, position=0):
        return np.zeros(ids.shape[0]), Forward(0.0)


def test_the_baselines_documented_chunks():
    """SGLang's --chunked-prefill-size in KTransformers' DeepSeek-V4-Flash recipe; llama.cpp's default -ub; Ostinato
    the plan's prefill chunk."""
    c = v4_cost(load_hardware("rtx4090d-x4"))
    hot = hot_of(c)
    assert (RECIPE_CHUNKED_PREFILL, N_UBATCH) == (2048, 512)
    assert KTransformers(c, DOCUMENTED_THRESHOLD, hot).prefill_chunk == 2048
    assert LayerPlacement(c, 20).prefill_chunk == CpuExperts(c).prefill_chunk == LruCache(c, hot).prefill_chunk == 512
    assert Ostinato(c, hot, THRESHOLD, BUCKETS).prefill_chunk == c.prefill_chunk == CHUNK


def test_each_system_prefills_in_its_own_chunks_over_the_same_routes(cost):
    """One replay, three chunk sizes: each system's forwards are its chunks at their positions, and the routes of
    its forwards add up to the same per-turn routes as every other system's (one trace, cut differently)."""
    systems = [Recording(cost, 4096, "plan"), Recording(cost, 2048, "sglang"), Recording(cost, 512, "ubatch")]
    sampler = TraceSampler(np.stack([l.share for l in cost.layers]), cost.cfg.num_experts_per_tok, 5)
    simulate([SessionShape("s", (Turn(5000, 2), Turn(700, 1)))], systems, sampler)
    plan, sglang, ubatch = ([(n, at) for n, at, _ in s.forwards] for s in systems)
    assert plan == [(4096, 0), (904, 4096), (700, 5002)]
    assert sglang == [(2048, 0), (2048, 2048), (904, 4096), (700, 5002)]
    assert ubatch == [(512, 512 * i) for i in range(9)] + [(392, 4608), (512, 5002), (188, 5514)]
    for s in systems[1:]:
        first = [f for f in s.forwards if f[1] < 5000]
        assert (sum(c for *_, c in first) == sum(c for _, at, c in systems[0].forwards if at < 5000)).all()
    assert pieces(5000, {4096, 2048, ROUTING_GRAIN}) == [512] * 9 + [392]


def test_the_routing_drawn_does_not_depend_on_which_systems_run(cost):
    """The trace is drawn in pieces of ROUTING_GRAIN (every system's chunk a multiple of it): a system's forwards
    are routed the same whether or not a system of a smaller chunk runs beside it."""
    shares = np.stack([l.share for l in cost.layers])
    session = [SessionShape("s", (Turn(3000, 1), Turn(5000, 1)))]
    alone = Recording(cost, 4096, "plan")
    simulate(session, [alone], TraceSampler(shares, cost.cfg.num_experts_per_tok, 7))
    beside = [Recording(cost, 4096, "plan"), Recording(cost, 512, "ubatch")]
    simulate(session, beside, TraceSampler(shares, cost.cfg.num_experts_per_tok, 7))
    assert len(alone.forwards) == len(beside[0].forwards) == 3
    for (n, at, c), (m, bt, d) in zip(alone.forwards, beside[0].forwards):
        assert (n, at) == (m, bt) and (c == d).all()


def test_ktransformers_switches_a_forward_at_its_threshold_and_its_recipes_never_does(cost):
    """kt_ep_wrapper: a forward of num_tokens >= the threshold runs layerwise. Its recipe's forwards are 2,048
    tokens at most and its threshold 4,096, so a 10,000-token prompt runs every chunk on its CPU path; the threshold
    set well is at most a forward's tokens, or past them (never)."""
    hot = uniform_placed(hot_of(cost).shape, 64)
    kt = KTransformers(cost, 2048, hot, reuses_prefix=True)
    counts = even_counts(cost, 2048)
    assert kt.prefill(counts, 2048, AT).mode == "layerwise"
    assert kt.prefill(counts // 2, 1024, AT).mode == "cpu"
    documented = KTransformers(cost, DOCUMENTED_THRESHOLD, hot, reuses_prefix=True, name="recipe")
    sampler = TraceSampler(np.stack([l.share for l in cost.layers]), cost.cfg.num_experts_per_tok, 1)
    turn = simulate([SessionShape("s", (Turn(10_000, 1),))], [documented], sampler)["recipe"][0].turns[0]
    assert turn.prefill.mode == "cpu" and turn.prefill.upload_s == 0.0
    best = best_threshold(cost, hot)
    assert best <= RECIPE_CHUNKED_PREFILL or best == RECIPE_CHUNKED_PREFILL + 1


def test_llama_cpp_offloads_each_ubatch_and_copies_its_experts_again(cost):
    """A 4,096-token prompt is 8 ubatches of 512 (-ub): each one's op batch passes the offload minimum (32), so each
    copies the host experts it uses: 8 times a layer's touched experts, not once; a 4-token last ubatch computes on
    the CPU."""
    pol = CpuExperts(cost)
    sampler = TraceSampler(np.stack([l.share for l in cost.layers]), cost.cfg.num_experts_per_tok, 2)
    turn = simulate([SessionShape("s", (Turn(4100, 1),))], [pol], sampler)[pol.name][0].turns[0]
    one_forward = pol.prefill(even_counts(cost, CHUNK), CHUNK, 0)
    per_ubatch = pol.prefill(even_counts(cost, 512), 512, 0)
    assert one_forward.uploaded == per_ubatch.uploaded == cost.cfg.n_routed_experts * len(cost.layers)
    assert turn.prefill.uploaded > 7.9 * one_forward.uploaded    # (nearly) every expert touched by each ubatch
    assert turn.prefill.mode == "cpu" and turn.prefill.cpu_experts_s > 0   # the last: 4 tokens on the CPU
