"""Hot-set selection and layer partition are optimal (vs brute force) and deterministic."""

import itertools

import numpy as np
import pytest

from ostinato.compiler.placement import DoesNotFit, PlacementProblem, place, select_hot


def _brute_best_hot(counts, layers, n, cap):
    cells = [(l, e) for l in layers for e in range(counts.shape[1])]
    best = 0
    for k in range(min(n, len(cells)) + 1):
        for subset in itertools.combinations(cells, k):
            if cap is not None and any(sum(1 for c in subset if c[0] == l) > cap for l in layers):
                continue
            best = max(best, sum(int(counts[c]) for c in subset))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_greedy_hot_set_is_optimal(seed):
    rng = np.random.default_rng(seed)
    L, E = int(rng.integers(1, 4)), int(rng.integers(2, 5))
    counts = rng.integers(0, 6, size=(L, E))  # small values: many ties
    n = int(rng.integers(0, L * E + 1))
    cap = None if seed % 2 else int(rng.integers(1, E + 1))
    chosen = select_hot(counts, range(L), n, cap)
    assert sum(c[0] for c in chosen) == _brute_best_hot(counts, range(L), n, cap)
    assert len(chosen) <= n and len(set((c[1], c[2]) for c in chosen)) == len(chosen)


def _brute_best_partition(problem):
    L, G = len(problem.layer_bytes), len(problem.gpu_budget)
    best = -1
    for cuts in itertools.combinations(range(1, L), G - 1):
        bounds = (0,) + cuts + (L,)
        total = 0
        for g in range(G):
            free = problem.gpu_budget[g] - sum(problem.layer_bytes[bounds[g]:bounds[g + 1]])
            if free < 0:
                total = -1
                break
            chosen = select_hot(problem.counts, range(bounds[g], bounds[g + 1]), free // problem.expert_bytes, None)
            total += sum(c[0] for c in chosen)
        best = max(best, total)
    return best


@pytest.mark.parametrize("seed", range(10))
def test_partition_is_optimal(seed):
    rng = np.random.default_rng(100 + seed)
    L, G, E = int(rng.integers(2, 7)), int(rng.integers(1, 4)), 4
    G = min(G, L)
    problem = PlacementProblem(counts=rng.integers(0, 50, size=(L, E)),
                               layer_bytes=tuple(int(x) for x in rng.integers(10, 40, size=L)),
                               gpu_budget=tuple(int(x) for x in rng.integers(60, 160, size=G)), expert_bytes=10)
    best = _brute_best_partition(problem)
    if best < 0:
        with pytest.raises(DoesNotFit):
            place(problem)
        return
    result = place(problem)
    assert result.covered == best
    assert list(result.layer_gpu) == sorted(result.layer_gpu) and set(result.layer_gpu) == set(range(G))
    assert result.covered == sum(int(problem.counts[l, e]) for l, hot in enumerate(result.hot) for e in hot)


def test_ties_are_broken_by_layer_then_expert_id():
    counts = np.ones((2, 4), dtype=np.int64)
    chosen = select_hot(counts, range(2), 3, None)
    assert [(c[1], c[2]) for c in chosen] == [(0, 0), (0, 1), (0, 2)]
    p = PlacementProblem(counts=counts, layer_bytes=(0, 0), gpu_budget=(25,), expert_bytes=10)
    assert place(p).hot == ((0, 1), ())


def test_routes_decide_where_hot_capacity_goes():
    counts = np.array([[1, 1], [100, 90], [1, 1]])
    p = PlacementProblem(counts=counts, layer_bytes=(5, 5, 5), gpu_budget=(35,), expert_bytes=10)  # 2 slots
    assert place(p).hot == ((), (0, 1), ())


def test_misfit_names_the_device_and_shortfall():
    p = PlacementProblem(counts=np.ones((4, 2), dtype=np.int64), layer_bytes=(50, 50, 50, 80),
                         gpu_budget=(100, 100), expert_bytes=1)
    with pytest.raises(DoesNotFit) as e:
        place(p)
    assert e.value.device == 1 and e.value.short_by == 30
