"""Layer-to-GPU partition and hot-set selection, maximizing the profiled route share.

Objective: the number of profiled routes that land on a resident (hot) expert, summed over all
layers. Within one GPU every expert costs the same bytes, so with a budget of n experts the best
hot set is the n largest counts among its layers' experts (exchange argument: swapping any chosen
expert for an unchosen one with a larger count would increase the total). An optional per-layer
cap keeps that true: the feasible sets form a laminar matroid, on which greedy is optimal.
The partition into contiguous layer ranges is an exact dynamic program over split points.

Ties are broken deterministically: by count (larger first), then layer, then expert id
(smaller first); among partitions of equal value the one with the smaller largest dense load,
then the earliest split points.

The MTP block (speculative decoding's draft) runs beside the head, on the last layer's GPU: its bytes
come out of the last GPU's budget, and with a profile row (`mtp_counts`) it is one more layer of that
GPU, index L, whose experts compete for its slots by count under the same cap; without one it gets none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class PlacementProblem:
    counts: np.ndarray              # [L, E] objective route counts per layer and expert
    layer_bytes: tuple[int, ...]    # [L] bytes a layer pins on its GPU before hot experts
    gpu_budget: tuple[int, ...]     # [G] usable bytes per GPU after its fixed (layer-independent) costs
    expert_bytes: int
    max_hot_per_layer: int | None = None
    mtp_bytes: int = 0                       # the MTP block's bytes on the last GPU before hot experts (0: none)
    mtp_counts: np.ndarray | None = None     # [E] its route counts (None: no hot experts for it)


@dataclass(frozen=True)
class Placement:
    layer_gpu: tuple[int, ...]            # [L] GPU index of each layer
    hot: tuple[tuple[int, ...], ...]      # [L] sorted hot expert ids of each layer
    covered: int                          # routes landing on hot experts (objective value), the MTP block's too
    mtp_hot: tuple[int, ...] = ()         # sorted hot expert ids of the MTP block (on the last GPU)


class DoesNotFit(ValueError):
    """No placement exists; `device` and `short_by` say where and by how much."""

    def __init__(self, message: str, device: int, short_by: int):
        super().__init__(message)
        self.device, self.short_by = device, short_by


def select_hot(counts: np.ndarray, layers: range, n: int, cap: int | None) -> list[tuple[int, int, int]]:
    """Greedy: the n best (count, layer, expert) among `layers`, at most `cap` per layer."""
    candidates = []
    for layer in layers:
        row = counts[layer]
        order = np.lexsort((np.arange(row.size), -row))  # count desc, then expert id asc
        if cap is not None:
            order = order[:cap]
        candidates += [(int(row[e]), layer, int(e)) for e in order]
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    return candidates[:max(n, 0)]


class _RangeValues:
    """Covered routes of the best hot set for any layer range and slot count, from cached cumsums."""

    def __init__(self, counts: np.ndarray, cap: int | None):
        self.per_layer = [np.sort(row)[::-1][:cap] for row in counts]  # each [<=E] desc
        self.cache: dict[tuple[int, int], np.ndarray] = {}

    def covered(self, start: int, stop: int, slots: int) -> int:
        if slots <= 0:
            return 0
        key = (start, stop)
        if key not in self.cache:
            merged = np.sort(np.concatenate(self.per_layer[start:stop]))[::-1]
            self.cache[key] = np.cumsum(merged)
        cum = self.cache[key]
        if cum.size == 0:  # max_hot_per_layer 0: an all-cold placement covers nothing
            return 0
        return int(cum[min(slots, cum.size) - 1])


def place(problem: PlacementProblem) -> Placement:
    L, G = len(problem.layer_bytes), len(problem.gpu_budget)
    if G > L:
        raise ValueError(f"{G} GPUs for {L} layers: use at most {L} GPUs")
    if problem.mtp_bytes:
        problem = replace(problem, gpu_budget=(*problem.gpu_budget[:-1], problem.gpu_budget[-1] - problem.mtp_bytes))
    counts = problem.counts if problem.mtp_counts is None else np.vstack((problem.counts, problem.mtp_counts[None]))
    end = len(counts)  # the last GPU's range runs to here: its layers' rows, then the MTP block's
    # best[g][j]: best (covered, -max_load) for layers [0, j) on GPUs [0, g); back[g][j]: split point
    NEG = (-1, 0)
    values = _RangeValues(counts, problem.max_hot_per_layer)
    prefix = np.concatenate(([0], np.cumsum(problem.layer_bytes)))
    best = [[NEG] * (L + 1) for _ in range(G + 1)]
    back = [[-1] * (L + 1) for _ in range(G + 1)]
    best[0][0] = (0, 0)
    for g in range(1, G + 1):
        for j in range(g, L - (G - g) + 1):
            for i in range(g - 1, j):
                if best[g - 1][i] == NEG:
                    continue
                load = int(prefix[j] - prefix[i])
                free = problem.gpu_budget[g - 1] - load
                if free < 0:
                    continue
                covered = values.covered(i, end if j == L else j, free // problem.expert_bytes)
                cand = (best[g - 1][i][0] + covered, min(best[g - 1][i][1], -load))
                if cand > best[g][j]:
                    best[g][j], back[g][j] = cand, i
    if best[G][L] == NEG:
        raise _explain_misfit(problem)
    splits, j = [], L
    for g in range(G, 0, -1):
        i = back[g][j]
        splits.append((i, j))
        j = i
    splits.reverse()
    layer_gpu = [0] * L
    hot: list[list[int]] = [[] for _ in range(end)]
    covered = 0
    for g, (i, j) in enumerate(splits):
        free = problem.gpu_budget[g] - sum(problem.layer_bytes[i:j])
        for count, layer, expert in select_hot(counts, range(i, end if j == L else j), free // problem.expert_bytes,
                                               problem.max_hot_per_layer):
            hot[layer].append(expert)
            covered += count
        for layer in range(i, j):
            layer_gpu[layer] = g
    return Placement(tuple(layer_gpu), tuple(tuple(sorted(h)) for h in hot[:L]), covered,
                     tuple(sorted(hot[L])) if end > L else ())


def _explain_misfit(problem: PlacementProblem) -> DoesNotFit:
    """Name the device that is short, and by how much, under the split that minimizes the worst shortfall."""
    L, G = len(problem.layer_bytes), len(problem.gpu_budget)
    prefix = np.concatenate(([0], np.cumsum(problem.layer_bytes)))
    INF = float("inf")
    # worst[g][j]: smallest possible largest shortfall placing layers [0, j) on GPUs [0, g)
    worst = [[INF] * (L + 1) for _ in range(G + 1)]
    back = [[0] * (L + 1) for _ in range(G + 1)]
    worst[0][0] = -INF
    for g in range(1, G + 1):
        for j in range(g, L + 1):
            for i in range(g - 1, j):
                cand = max(worst[g - 1][i], int(prefix[j] - prefix[i]) - problem.gpu_budget[g - 1])
                if cand < worst[g][j]:
                    worst[g][j], back[g][j] = cand, i
    device, short, j = 0, 0, L
    for g in range(G, 0, -1):
        i = back[g][j]
        need = int(prefix[j] - prefix[i]) - problem.gpu_budget[g - 1]
        if need >= short:
            device, short = g - 1, need
        j = i
    return DoesNotFit(f"device {device} is short by {short:,d} bytes for its layers' dense weights, KV cache and "
                      "buffers alone", device, short)
