"""The session simulator's fast paths give the very numbers of the plain ones they replace: the documented tables
(docs/benchmarks.md) are compared byte for byte with a replay, so a fast path may save work but never change a
draw, a price or its order. Each test states the plain way beside the fast one."""

import numpy as np
import pytest

from ostinato.bench.simulator.ktransformers import top_of_batch
from ostinato.bench.simulator.policy import _Prices, dense_seconds, resident_hits
from ostinato.bench.simulator.trace import EXACT_MAX, TraceSampler, _drawn_before, counts_of
from ostinato.workload import SessionShape, Turn


def zipf_shares(layers=5, experts=64, exponent=0.9, seed=0):
    rng = np.random.default_rng(seed)
    curve = 1.0 / np.arange(1, experts + 1) ** exponent
    return np.stack([rng.permutation(curve) for _ in range(layers)])


def counts_one_by_one(sampler: TraceSampler, n: int) -> np.ndarray:
    """TraceSampler.counts as it was: one multinomial call per layer for a long pass."""
    L, E = sampler.shares.shape
    if n <= EXACT_MAX:
        return counts_of(sampler.ids(n), E)
    return np.stack([sampler.rng.multinomial(n * sampler.k, sampler.route_p[l]) for l in range(L)])


def test_pieces_drawn_together_are_the_numbers_drawn_one_by_one():
    sizes = [512, 512, 100, 512, 257, 512, 3, EXACT_MAX, 512, 512, 2048, 1]
    plain, fast = TraceSampler(zipf_shares(), 6, (0, 1)), TraceSampler(zipf_shares(), 6, (0, 1))
    expected = [counts_one_by_one(plain, n) for n in sizes]
    got = fast.counts_of_pieces(sizes)
    assert len(got) == len(expected)
    for n, e, g in zip(sizes, expected, got):
        assert g.shape == e.shape and g.dtype == e.dtype and np.array_equal(g, e), n
        assert g.sum() == n * 6 * 5   # every route of every layer
    assert plain.rng.random() == fast.rng.random()   # the stream left where the calls one by one leave it
    single = TraceSampler(zipf_shares(), 6, 3)
    assert np.array_equal(single.counts(700), counts_one_by_one(TraceSampler(zipf_shares(), 6, 3), 700))


def test_each_tokens_repeated_draws_are_marked_as_the_pairwise_comparison_marks_them():
    rng = np.random.default_rng(0)
    for tokens, experts in ((0, 8), (1, 2), (50, 3), (200, 256)):
        cand = rng.integers(0, experts, (tokens, 18))
        pairwise = ((cand[:, :, None] == cand[:, None, :]) & np.tri(18, 18, -1, dtype=bool)).any(axis=2)
        assert np.array_equal(_drawn_before(cand, experts), pairwise)


def test_the_dynamic_updates_gpu_set_is_each_layers_order_of_routes_residence_and_id():
    rng = np.random.default_rng(1)
    for _ in range(50):
        counts = rng.integers(0, 4, (6, 32))   # few values: many ties, broken by residence, then by id
        gpu = rng.random((6, 32)) < rng.random()
        plain = np.zeros_like(gpu)
        for l in range(6):
            order = np.lexsort((np.arange(32), ~gpu[l], -counts[l]))
            plain[l, order[:int(gpu[l].sum())]] = True
        assert np.array_equal(top_of_batch(counts, gpu), plain)


def test_resident_hits_are_the_gpu_set_taken_along_the_experts():
    rng = np.random.default_rng(2)
    gpu = rng.random((7, 40)) < 0.3
    for tokens in (0, 1, 33):
        ids = rng.integers(0, 40, (tokens, 7, 6))
        assert np.array_equal(resident_hits(gpu, ids), np.take_along_axis(gpu[None], ids, axis=2))


@pytest.fixture(scope="module")
def world():
    from ostinato.bench.simulator.world import build_world
    return build_world()


@pytest.mark.slow
def test_remembered_prices_are_the_cost_models_own_values(world):
    """dense_seconds and _Prices return what the cost model's calls return, for every system's cost model (the
    plan's, KTransformers' and llama.cpp's differ in weights, kernels and attention), before and after they
    remember it."""
    costs = {id(p.cost): p.cost for p in world.policies("best") + world.policies("documented")}.values()
    for cost in costs:
        L = len(cost.layers)
        for n, position in ((2048, 0), (2048, 4096), (300, 12345), (1, 7)):
            for _ in range(2):   # computed, then remembered
                before = dense_seconds(cost, n, position)
                whole = dense_seconds(cost, n, position, whole=True, on_host=True)
                assert [before[l] for l in range(L)] == [cost.before_experts_time(l, n, position) for l in range(L)]
                assert [whole[l] for l in range(L)] == [cost.attention_time(l, n, position, on_host=True)
                                                        for l in range(L)]
            context = cost.step_context(2, position)
            assert [dense_seconds(cost, 2, position, step_context=context)[l] for l in range(L)] == [
                cost.before_experts_time(l, 2, position, step_context=context) for l in range(L)]
        prices = _Prices.of(cost)
        assert _Prices.of(cost) is prices
        for _ in range(2):
            assert prices.gpu_experts(cost, 17.0, 400.0) == cost.gpu_experts_time(17.0, 400.0)
            assert prices.cpu_experts(cost, 64, 30.0, 120.0) == cost.cpu_experts_time(64, 30.0, 120.0)
            assert prices.cpu_experts(cost, 64, 0.0, 0.0) == cost.cpu_experts_time(64, 0.0, 0.0)
            assert prices.upload(cost, 200.0, 4) == cost.upload_time(200.0, links=4)


@pytest.mark.slow
def test_the_equal_kernels_runs_riding_on_the_tables_replay_are_those_of_their_own_replay(world):
    """modeled_tables' equal-kernels column: its configurations' runs made in workload_runs' replay (one trace for
    both worlds) are exactly config_runs' of that world alone, prefix-less systems' context prefilled again too."""
    from ostinato.bench import sessions as bench_sessions
    from ostinato.bench.simulator import bench
    from ostinato.bench.simulator.replay import simulate

    equal = bench_sessions.at_equal_kernels(world)
    sessions = [SessionShape(f"mini-swe-agent/t{i}", (Turn(1500 + 300 * i, 20), Turn(700, 12), Turn(90, 30)))
                for i in range(2)]
    bench.workload_runs(world, sessions, 5, equal)
    k = world.build.config.num_experts_per_tok
    for config in bench.CONFIG_TITLES:
        key = bench._runs_key(equal, config, sessions, 5)
        assert key in bench._RUNS   # made by the shared replay, not by config_runs
        alone = simulate(sessions, equal.policies(config), TraceSampler(equal.shares, k, 5))
        assert bench._RUNS[key] == alone
        assert bench._RUNS[bench._runs_key(world, config, sessions, 5)] != alone   # the kernels do differ


@pytest.mark.slow
def test_a_remembered_run_of_decode_steps_is_first_parts_of_its_positions(world):
    from ostinato.bench.simulator.policy import first_parts, run_first_parts
    for fixed_shape in (True, False):
        for start, steps in ((0, 5), (509, 9), (0, 5), (70000, 3)):
            for _ in range(2):
                got = run_first_parts(world.cost, 1, start, steps, fixed_shape)
                assert np.array_equal(got, first_parts(world.cost, 1, start + np.arange(steps), fixed_shape))
                assert not got.flags.writeable


def test_the_systems_both_replays_run_alike_are_one_instance_each(world):
    """World.policies' configurations share the systems they run alike, and the re-placement study the tables'
    KTransformers at its best, so that one replay of them all (bench.workload_runs) prices each system once."""
    from ostinato.bench.simulator.replacement import KT_FREQUENCY, replacement_policies
    best, documented = world.policies("best"), world.policies("documented")
    shared = {p.name for p in best if any(p is q for q in documented)}
    assert shared == {p.name for p in world.alike} and len(shared) == 4
    assert [p.name for p in replacement_policies(world)].count(KT_FREQUENCY) == 1
    assert next(p for p in replacement_policies(world) if p.name == KT_FREQUENCY) is world.kt_frequency
    assert best[2] is world.kt_frequency and not best[2].reuses_prefix
