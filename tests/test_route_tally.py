"""Steps' routes counted in batches (runtime/engine/route_tally.py): the same counts as counting each step
when it ran, with the hot sets each step ran with."""

import numpy as np
import torch

from ostinato.runtime.engine import route_tally
from ostinato.runtime.engine.counters import Counters
from ostinato.runtime.engine.route_tally import RouteTally, distinct_per_row


def _counted_one_by_one(hot_of: np.ndarray, first: int, ids: np.ndarray, c: Counters) -> None:
    """The plain count of one step, ids [L', T, k]."""
    for i, layer_ids in enumerate(ids.reshape(ids.shape[0], -1)):
        hot = hot_of[first + i]
        c.forwards += 1
        c.routes_hot += sum(bool(hot[e]) for e in layer_ids)
        c.routes_cold += sum(not hot[e] for e in layer_ids)
        c.distinct_cold += len({int(e) for e in layer_ids if not hot[e]})


def test_a_batch_counts_what_each_step_would_have_counted():
    g = torch.Generator().manual_seed(1)
    L, E, k = 5, 16, 4
    hot_of = torch.rand(L, E, generator=g) < 0.4
    tally, got, want = RouteTally(hot_of), Counters(), Counters()
    for step in range(40):
        # decode steps of all layers (one token, two), and a one-layer step after them (an MTP block's)
        first, layers, T = [(0, 4, 1), (0, 4, 2), (4, 1, 1)][step % 3]
        ids = torch.randint(0, E, (layers, T, k), generator=g)
        ids[:, :, 1] = ids[:, :, 0]  # repeats within a layer: counted once among the distinct
        _counted_one_by_one(hot_of.numpy(), first, ids.numpy(), want)
        tally.add(first, ids, got)
        ids.fill_(-7)  # the step's buffer is written again: the tally holds its own copy
    tally.flush(got)
    assert got == want and want.routes_cold > 0 and want.distinct_cold < want.routes_cold


def test_steps_are_counted_with_the_hot_sets_they_ran_with_and_unasked_after_a_batch(monkeypatch):
    monkeypatch.setattr(route_tally, "BATCH", 3)
    hot_of = torch.zeros(1, 4, dtype=torch.bool)
    tally, c = RouteTally(hot_of), Counters()
    tally.add(0, torch.tensor([[0, 1]]), c)
    tally.flush(c)  # what the executor does before mark_hot
    hot_of[0, 0] = True
    tally.add(0, torch.tensor([[0, 1]]), c)
    assert (c.routes_hot, c.routes_cold, c.distinct_cold) == (0, 2, 2)
    tally.add(0, torch.tensor([[0, 0]]), c)
    tally.add(0, torch.tensor([[2, 2]]), c)  # the third held step: counted without a flush
    assert (c.forwards, c.routes_hot, c.routes_cold, c.distinct_cold) == (4, 3, 5, 4)
    assert not tally.held


def test_distinct_per_row_skips_the_uncounted():
    assert distinct_per_row(np.array([[-1, 3, 3, 5], [-1, -1, -1, -1], [2, 2, 2, 2], [4, 1, -1, 1]])) == 2 + 0 + 1 + 2
