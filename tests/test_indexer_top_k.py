"""The prefill's indexer selection by top-k (indexer.top_k_earliest_by_topk) gives exactly the rule's answer
(top_k_earliest: a stable full sort, the earlier entry first among equal scores): the same indices in the
same order, on scores made of the ties a real prefill has (relu zeros, +-0.0, masked -inf tails)."""

import torch

from ostinato.runtime.model.indexer import select, top_k_earliest, top_k_earliest_by_topk


def _scores(t: int, n: int, seed: int) -> torch.Tensor:
    """[t, n] float32 like select's: relu'd sums (many exact zeros, of either sign), coarse values that tie,
    and each row's not yet visible tail masked to -inf (rows from fully masked to fully visible)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.relu(torch.randn(t, n, generator=g)) * torch.randn(t, 1, generator=g)  # negative weights: -0.0
    s = torch.where(torch.rand(t, n, generator=g) < 0.3, torch.round(s * 2) / 2, s)  # exact ties away from zero
    visible = torch.randint(0, n + 1, (t, 1), generator=g)
    return s.masked_fill(torch.arange(n) >= visible, float("-inf"))


def test_top_k_by_topk_is_the_stable_sorts_answer():
    for seed in range(40):
        g = torch.Generator().manual_seed(1000 + seed)
        n = int(torch.randint(1, 700, (1,), generator=g))
        k = min(int(torch.randint(1, 200, (1,), generator=g)), n)
        s = _scores(33, n, seed)
        assert torch.equal(top_k_earliest_by_topk(s, k), top_k_earliest(s, k)), (seed, n, k)
    # leading dims, and rows that all tie
    s = _scores(24, 300, 7).view(2, 3, 4, 300)
    assert torch.equal(top_k_earliest_by_topk(s, 64), top_k_earliest(s, 64))
    zeros = torch.zeros(5, 40)
    zeros[1::2] = -0.0
    assert top_k_earliest_by_topk(zeros, 6).tolist() == [list(range(6))] * 5


def test_select_picks_what_the_sort_would():
    g = torch.Generator().manual_seed(3)
    T, HI, dI, n, ratio, k = 50, 4, 16, 400, 4, 32
    q, w, keys = torch.randn(T, HI, dI, generator=g), torch.randn(T, HI, generator=g), torch.randn(n, dI, generator=g)
    positions = torch.arange(1560, 1560 + T)  # (1560 + 1) // 4 = 390 visible at the first query
    got = select(q, w, keys, positions, ratio, k)
    from ostinato.runtime.model.indexer import index_scores
    scores = index_scores(q, w, keys).masked_fill(torch.arange(n) >= ((positions + 1) // ratio)[:, None], float("-inf"))
    want = top_k_earliest(scores, k)
    assert torch.equal(got, torch.where(want >= ((positions + 1) // ratio)[:, None], -1, want))
