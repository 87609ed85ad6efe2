"""The fixed-shape steps' routes, counted in batches rather than one step at a time.

Counting a decode step's routes (hot or cold, distinct cold experts per layer) is a few dozen values of
numpy work: 14 us when its code and data are in cache, but 0.15-0.23 ms right after a step, whose head
has just streamed 66 MB through the caches (the real-vocab preset, 2 Zen 4 cores: 4% of a 5.2 ms token).
So a step only copies its ids aside (one small numpy copy), and they are counted together, in one set of
array operations, when the counters are read, when the hot sets change, or every BATCH steps.

    tally = RouteTally(hot_of)             # hot_of [L, E] bool, the executor's (read at each flush)
    tally.add(first_layer, ids)            # ids [L', T, k] or [L', k]: layers first_layer ..
    tally.flush(counters)                  # the counts of every step added since the last flush

Legend: n steps held, L' layers of a step, R routes of a layer in a step (T * k).
"""

from __future__ import annotations

import numpy as np
import torch

from .counters import Counters

BATCH = 256  # steps held before they are counted unasked (a caller that never reads the counters)


class RouteTally:
    def __init__(self, hot_of: torch.Tensor):
        self.hot_of = hot_of  # [L, E] bool on the CPU, shared with the executor (mark_hot writes it)
        self.held: dict[tuple[int, tuple[int, ...]], list[np.ndarray]] = {}  # (first layer, shape) -> steps' ids

    def add(self, first_layer: int, expert_ids: torch.Tensor, counters: Counters) -> None:
        """Hold a copy of one step's ids (the step's buffer is written again by the next step)."""
        ids = expert_ids.numpy().reshape(expert_ids.shape[0], -1)  # [L', R]
        steps = self.held.setdefault((first_layer, ids.shape), [])
        steps.append(ids.copy())
        if len(steps) >= BATCH:
            self.flush(counters)

    def flush(self, counters: Counters) -> None:
        """Add the held steps' routes to `counters` (with the hot sets as they are now) and drop them."""
        hot_of = self.hot_of.numpy()
        for (first, (layers, _)), steps in self.held.items():
            ids = np.stack(steps)  # [n, L', R]
            hot = hot_of[first:first + layers]  # [L', E]
            is_hot = hot[np.arange(layers)[None, :, None], ids]  # [n, L', R]
            counters.forwards += ids.shape[0] * layers
            counters.routes_hot += int(is_hot.sum())
            counters.routes_cold += int(is_hot.size - is_hot.sum())
            counters.distinct_cold += distinct_per_row(np.where(is_hot, -1, ids).reshape(-1, ids.shape[-1]))
        self.held.clear()


def distinct_per_row(ids: np.ndarray) -> int:
    """ids [m, R], -1 where a route does not count -> the sum over rows of each row's distinct ids >= 0."""
    ids = np.sort(ids, axis=1)
    first = ids[:, :1] >= 0                                       # [m, 1]: a row's first counted id
    new = (ids[:, 1:] >= 0) & (ids[:, 1:] != ids[:, :-1])         # [m, R - 1]: a counted id not seen before
    return int(first.sum() + new.sum())
