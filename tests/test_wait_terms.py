"""The p90 verdict's breakdown (#57, bench/simulator/wait_terms.py): each wait split into the cost model's priced
terms adds up to the wait the policy priced, on every path a prefill or a decode step takes, for Ostinato and for
KTransformers; the band is Ostinato's p85-p95 turns; the verdict names the largest term."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from simulator_helpers import HW, MS

from ostinato.bench.simulator import wait_terms as wt
from ostinato.bench.simulator.ktransformers import KTransformers
from ostinato.bench.simulator.ostinato_policy import Ostinato
from ostinato.bench.simulator.policy import Forward
from ostinato.bench.simulator.replay import SessionTime, TurnTime, simulate
from ostinato.bench.simulator.trace import TraceSampler
from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import layer_specs
from ostinato.compiler.cost_model import CostModel, LayerCostInputs
from ostinato.compiler.memory_model import layer_dense_bytes
from ostinato.hardware import load_hardware
from ostinato.workload import SessionShape, Turn

V4 = Path(__file__).resolve().parents[1] / "plans" / "models" / "deepseek-v4-flash"
HOT = 64


def v4_cost() -> CostModel:
    """V4-Flash in fp8 on rtx4090d-x4 (4 GPUs, so uploads shard), its first HOT experts of every layer hot, routes
    falling off with the id (Zipf 0.9, as the simulator's profile)."""
    cfg = ModelConfig.from_json(V4)
    E = cfg.n_routed_experts
    share = 1.0 / np.arange(1, E + 1) ** 0.9
    layers = [LayerCostInputs(0, layer_dense_bytes(cfg, l, "fp8"),
                              sum(int(np.prod(s.shape)) for s in layer_specs(cfg, l, with_experts=False)
                                  if len(s.shape) == 2 and s.role != "hash_table" and not s.is_scale
                                  and not s.name.endswith("_fn")),
                              np.arange(E) < HOT, share / share.sum()) for l in range(cfg.n_layers)]
    return CostModel(cfg, load_hardware("rtx4090d-x4"), layers, 13_369_344, 0, 65_536, dense_format="fp8")


@pytest.fixture(scope="module")
def systems():
    cost = v4_cost()
    hot = np.stack([l.hot for l in cost.layers])
    ours = Ostinato(cost, hot, threshold=300, buckets=[2, 4], shard_threshold=600)
    theirs = KTransformers(cost, 256, hot, reuses_prefix=True, name="KT")
    sampler = TraceSampler(np.stack([l.share for l in cost.layers]), cost.cfg.num_experts_per_tok, 0)
    return ours, theirs, sampler


@pytest.mark.parametrize("n, mode", [(3, "bucket"), (100, "split"), (400, "upload"), (900, "sharded")])
@pytest.mark.parametrize("position", [0, 30_000])
def test_ostinatos_terms_add_up_to_its_priced_prefill_on_every_path(systems, n, mode, position):
    ours, _, sampler = systems
    counts = sampler.counts(n)
    f = ours.prefill(counts, n, position)
    terms = wt.prefill_terms(ours, counts, n, position)
    assert f.mode == mode
    assert wt.total(terms) == pytest.approx(f.seconds, rel=1e-9)
    assert set(terms) <= set(wt.TERMS) and all(v >= 0 for v in terms.values())
    if mode in ("upload", "sharded"):
        assert terms[wt.COLD] > 0
    if mode == "sharded":
        assert terms[wt.EXCHANGE] > 0   # the shards' activations out and back


def test_a_sharded_layer_whose_exchange_outlasts_its_home_experts_counts_the_exchange(systems):
    """Links 10x slower: the hidden states' way out takes longer than the layer's GPU's own experts, so the layer's
    side is the exchange and the slice (sharded_layer's max), and the terms still add up."""
    ours, _, sampler = systems
    slow = ours.cost.hw.link.replace(h2d_bandwidth=2.5e9, d2h_bandwidth=2.5e9)
    cost = copy.copy(ours.cost)
    cost.hw = cost.hw.replace(link=slow)
    p = Ostinato(cost, ours.hot, ours.threshold, ours.buckets, shard_threshold=ours.shard_threshold)
    counts = sampler.counts(900)
    out, _ = cost.exchange_time(900)
    assert out > cost.shared_expert_time(2, 900) + cost.gpu_experts_time(HOT, 900 * 6)   # the way out is longer
    f = p.prefill(counts, 900, 30_000)
    assert f.mode == "sharded"
    assert wt.total(wt.prefill_terms(p, counts, 900, 30_000)) == pytest.approx(f.seconds, rel=1e-9)


@pytest.mark.parametrize("n, position", [(100, 0), (100, 30_000), (900, 30_000)])
def test_ktransformers_terms_add_up_to_its_priced_prefill_and_skip_the_indexers_score_tensors(systems, n, position):
    """KTransformers is priced with its kernels at the model's work (ktransformers.kt_cost: with_csa_picks_only): no
    materialized indexer scores, which Ostinato's runtime writes; the breakdown shows that asymmetry as a term."""
    ours, theirs, sampler = systems
    counts = sampler.counts(n)
    f = theirs.prefill(counts, n, position)
    terms = wt.prefill_terms(theirs, counts, n, position)
    assert f.mode == ("layerwise" if n > 256 else "cpu")
    assert wt.total(terms) == pytest.approx(f.seconds, rel=1e-9)
    assert terms.get(wt.INDEXER, 0.0) == 0.0
    if position:
        split = wt.split_terms(ours.cost, counts, n, ours.hot, position)
        assert split[wt.INDEXER] > 0


@pytest.mark.parametrize("position", [0, 5_000, 60_000])
def test_the_first_decode_steps_terms_add_up_for_both_systems(systems, position):
    ours, theirs, sampler = systems
    ids = sampler.ids(3)
    for p in (ours, theirs):
        steps, _ = p.decode(ids, position)
        assert wt.total(wt.decode_terms(p, ids, position)) == pytest.approx(float(steps[0]), rel=1e-9)


def test_the_replays_turn_terms_add_up_to_each_turns_wait(systems):
    """Itemized records per session and turn the terms of the wait replay.py states (prefill + first decode step),
    chunked prefills included; the first turn's wait is its whole prompt."""
    ours, theirs, _ = systems
    sessions = [SessionShape("a/s0", (Turn(5000, 3), Turn(120, 2), Turn(900, 0), Turn(0, 4))),
                SessionShape("a/s1", (Turn(700, 1), Turn(3, 2)))]
    a, b = wt.Itemized(ours), wt.Itemized(theirs)
    sampler = TraceSampler(np.stack([l.share for l in ours.cost.layers]), ours.cost.cfg.num_experts_per_tok, 1)
    runs = simulate(sessions, [a, b], sampler, chunk=4096)
    plain = simulate(sessions, [ours, theirs], TraceSampler(sampler.shares, sampler.k, 1), chunk=4096)
    for p in (a, b):
        assert [len(t) for t in p.turns] == [4, 2]
        for s, st in enumerate(runs[p.name]):
            for i, turn in enumerate(st.turns):
                assert wt.total(p.turns[s][i]) == pytest.approx(turn.wait_s, rel=1e-9)
                assert turn.wait_s == plain[p.name][s].turns[i].wait_s   # itemizing changes no price


def test_a_policy_priced_otherwise_than_its_terms_is_refused(systems):
    """The check cannot pass by construction: a policy whose price drifts from the breakdown's arithmetic fails."""
    ours, _, sampler = systems

    class Drifted(Ostinato):
        def prefill(self, counts, n, position=0):
            f = super().prefill(counts, n, position)
            return Forward(f.seconds + 1 * MS, mode=f.mode)

    drifted = Drifted(ours.cost, ours.hot, ours.threshold, ours.buckets, shard_threshold=ours.shard_threshold)
    itemized = wt.Itemized(drifted)
    itemized.reset()
    with pytest.raises(AssertionError, match="no longer follows policy.py"):
        itemized.prefill(sampler.counts(100), 100, 0)


def test_the_hand_off_is_the_host_sides_rest_and_the_larger_side_is_counted():
    """cpu_experts_time = the host kernel + the activations both ways + the hand-off; a layer counts its longer side."""
    from test_simulator import cost as hand_cost
    c = hand_cost()
    c.hw = HW.replace(host=HW.host.replace(task_handoff_s=3 * MS))
    terms = wt.host_side_terms(c, 1, 1.0, 1.0)
    assert terms[wt.HANDOFF] == pytest.approx(3 * MS)
    assert terms[wt.COLD] == pytest.approx(c.host_experts_time(1.0, 1.0))
    assert wt.total(terms) == pytest.approx(c.cpu_experts_time(1, 1.0, 1.0))
    assert wt.concurrent(c, {wt.GPU: 1.0}, terms) == {wt.GPU: 1.0}          # the GPU side is the longer
    assert wt.concurrent(c, {wt.GPU: 1 * MS}, terms) == terms               # the host side is
    cpu_only = c.hw.replace(cpu_only=True)
    c.hw = cpu_only   # the same cores: both sides add up
    assert wt.concurrent(c, {wt.GPU: 1 * MS}, terms) == wt.add({wt.GPU: 1 * MS}, terms)


def turn(wait: float, mode: str = "split") -> TurnTime:
    return TurnTime(10, 1, Forward(wait, mode=mode), Forward(0.0), wait)


def test_the_band_is_the_turns_between_the_p85_and_p95_waits_after_each_sessions_first():
    waits = list(np.arange(1, 21) / 10)   # 0.1 .. 2.0 s over two sessions; the first turns (99 s) are not read
    runs = [SessionTime("s0", tuple(turn(w) for w in [99.0] + waits[:10])),
            SessionTime("s1", tuple(turn(w) for w in [99.0] + waits[10:]))]
    picked, (lo, hi) = wt.band_turns(runs)
    assert (lo, hi) == pytest.approx((np.percentile(waits, 85), np.percentile(waits, 95)))
    assert sorted(runs[s].turns[i].wait_s for s, i in picked) == [w for w in waits if lo <= w <= hi] == [1.8, 1.9]
    with pytest.raises(ValueError, match="no turn after a session's first"):
        wt.band_turns([SessionTime("s", (turn(1.0),))])


def test_the_verdict_states_each_term_and_names_the_largest_difference():
    ours = {wt.DENSE: 0.1, wt.INDEXER: 0.3, wt.COLD: 0.7, wt.EXCHANGE: 0.05}
    theirs = {wt.DENSE: 0.1, wt.COLD: 0.8}
    group = wt.ModeGroup("sharded", 4, 1.15, 0.9, ours)
    b = wt.Breakdown("coding", 4, (1.0, 1.3), ours, theirs, 1.15, 0.9, 1.2, (group,))
    assert b.largest() == wt.INDEXER
    text = wt.verdict_table([b], "KT")
    assert f"| coding | {wt.INDEXER} | 300.0 | 0.0 | +300.0 | +120% |" in text
    assert f"| coding | {wt.COLD} | 700.0 | 800.0 | -100.0 | -40% |" in text
    assert wt.HANDOFF not in text   # a term neither system pays is left out
    assert "p90 wait 1.20x the baseline's (goal 0.8x: not met)" in text
    assert f"largest term of the difference is {wt.INDEXER} (+300.0 ms)" in text
    assert f"4 sharded (Ostinato 1150 ms, baseline 900 ms; Ostinato's largest term, {wt.COLD}, alone 700 ms = " \
           "0.78x the baseline's wait)" in text


def test_the_indexers_score_tensors_are_their_counted_bytes_at_the_gpus_bandwidth(systems):
    """The term the verdict reads for the indexer: the bytes of Ostinato's fused GPU indexer (its [queries, rows]
    float32 scores and top-k's passes, 15 bytes a (query, row), and its queries read) for the rows a dynamic forward
    scores (one per 4 visible tokens) or a fixed-shape step's buffers hold, over the GPU's bandwidth; none on a layer
    without an indexer, none for a system priced with its picks only; the rest of the dense part is the DENSE term."""
    ours, theirs, _ = systems
    c, bw = ours.cost, ours.cost.hw.gpus.bandwidth
    heads, dim = c.cfg.index_n_heads, c.cfg.index_head_dim

    def fused(n: int, rows: int) -> int:
        return n * rows * (4 + 4 + 5 + 2) + n * heads * dim * 2

    csa, sliding = 2, 0
    terms = wt.dense_terms(c, csa, 100, 30_000)
    assert terms[wt.INDEXER] == pytest.approx(fused(100, 30_100 // 4) / bw)
    assert terms[wt.DENSE] == pytest.approx(float(c.before_experts_time(csa, 100, 30_000)) - terms[wt.INDEXER])
    step = wt.dense_terms(c, csa, 1, 30_000, step_context=65_536)
    assert step[wt.INDEXER] == pytest.approx(fused(1, 65_536 // 4) / bw)
    assert wt.dense_terms(c, sliding, 100, 30_000)[wt.INDEXER] == 0.0
    assert wt.dense_terms(theirs.cost, csa, 100, 30_000)[wt.INDEXER] == 0.0


def test_a_decode_on_the_plans_smaller_pool_adds_up_too(systems):
    """With the plan's decode threads set (policy.decode_cpu_threads), the decode step's terms price the host side
    on that pool as the policy does."""
    ours, _, sampler = systems
    cost = ours.cost.with_decode_threads(1)
    pooled = Ostinato(cost, ours.hot, threshold=300, buckets=[2, 4], shard_threshold=600)
    ids = sampler.ids(3)
    steps, _ = pooled.decode(ids, 5_000)
    assert steps[0] != ours.decode(ids, 5_000)[0][0]   # the pool's size moved the price
    assert wt.total(wt.decode_terms(pooled, ids, 5_000)) == pytest.approx(float(steps[0]), rel=1e-9)
