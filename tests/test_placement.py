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


@pytest.mark.parametrize("seed", range(10))
def test_partition_is_optimal(seed):
    rng = np.random.default_rng(100 + seed)
    L, G, E = int(rng.integers(2, 7)), int(rng.integers(1, 4)), 4
    G = min(G, L)
    problem = PlacementProblem(counts=rng.integers(0, 50, size=(L, E)),
                               layer_bytes=tuple(int(x) for x in rng.integers(10, 40, size=L)),
                               gpu_budget=tuple(int(x) for x in rng.integers(60, 160, size=G)), expert_bytes=10)
    result = _placed_optimally(problem)
    if result is None:
        return
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


def _placed_optimally(problem):
    """place(problem), checked against the brute force: its covered routes are the best (None: nothing fits,
    and place refuses)."""
    best = _brute_best_partition(problem)
    if best < 0:
        with pytest.raises(DoesNotFit):
            place(problem)
        return None
    result = place(problem)
    assert result.covered == best
    return result


def _brute_best_partition(problem):
    """The best total of hot routes over every split of the layers into GPUs (with the MTP block: its bytes on
    the last GPU, its row one more layer there)."""
    L, G = len(problem.layer_bytes), len(problem.gpu_budget)
    mtp = problem.mtp_counts is not None
    counts = np.vstack((problem.counts, problem.mtp_counts[None])) if mtp else problem.counts
    best = -1
    for cuts in itertools.combinations(range(1, L), G - 1):
        bounds = (0,) + cuts + (L,)
        total = 0
        for g in range(G):
            last = g == G - 1
            free = (problem.gpu_budget[g] - (problem.mtp_bytes if last else 0)
                    - sum(problem.layer_bytes[bounds[g]:bounds[g + 1]]))
            if free < 0:
                total = -1
                break
            rows = range(bounds[g], L + 1 if last and mtp else bounds[g + 1])
            chosen = select_hot(counts, rows, free // problem.expert_bytes, problem.max_hot_per_layer)
            total += sum(c[0] for c in chosen)
        best = max(best, total)
    return best


@pytest.mark.parametrize("seed", range(10))
def test_the_mtp_block_competes_for_the_last_gpus_slots_optimally(seed):
    rng = np.random.default_rng(200 + seed)
    L, E = int(rng.integers(2, 6)), 4
    G = min(int(rng.integers(1, 4)), L)
    problem = PlacementProblem(counts=rng.integers(0, 50, size=(L, E)),
                               layer_bytes=tuple(int(x) for x in rng.integers(10, 40, size=L)),
                               gpu_budget=tuple(int(x) for x in rng.integers(80, 160, size=G)), expert_bytes=10,
                               max_hot_per_layer=None if seed % 2 else 2, mtp_bytes=int(rng.integers(5, 30)),
                               mtp_counts=rng.integers(0, 80, size=E))
    result = _placed_optimally(problem)
    if result is None:
        return
    assert result.covered == (sum(int(problem.counts[l, e]) for l, hot in enumerate(result.hot) for e in hot)
                              + sum(int(problem.mtp_counts[e]) for e in result.mtp_hot))
    assert problem.max_hot_per_layer is None or len(result.mtp_hot) <= problem.max_hot_per_layer


def test_the_mtp_block_takes_its_bytes_and_its_best_experts_from_the_last_gpu():
    counts = np.array([[5, 4, 3], [5, 4, 3]])
    base = dict(counts=counts, layer_bytes=(10, 10), gpu_budget=(40, 40), expert_bytes=10)  # 3 slots per GPU
    assert place(PlacementProblem(**base)).hot == ((0, 1, 2), (0, 1, 2))
    # its bytes take a slot of the last GPU; without a row it gets no experts, whatever is free
    without_row = place(PlacementProblem(**base, mtp_bytes=10))
    assert without_row.hot == ((0, 1, 2), (0, 1)) and without_row.mtp_hot == ()
    assert place(PlacementProblem(**base, mtp_bytes=0, mtp_counts=np.zeros(3, dtype=np.int64))).hot[1] == (0, 1, 2)
    # with a row, its experts compete by routes with the last GPU's layers only
    placed = place(PlacementProblem(**base, mtp_bytes=10, mtp_counts=np.array([0, 9, 1])))
    assert placed.hot == ((0, 1, 2), (0,)) and placed.mtp_hot == (1,)
    assert placed.covered == 12 + 5 + 9
    # too big for the last GPU: named as that GPU's shortfall
    with pytest.raises(DoesNotFit) as e:
        place(PlacementProblem(**base, mtp_bytes=35))
    assert e.value.device == 1 and e.value.short_by == 5
