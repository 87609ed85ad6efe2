"""The lightning indexer's selection at a fixed shape (static twin of ../indexer.py `select`).

The dynamic path keeps the top min(index_topk, n) of the n entries so far; here all R rows of the
index-key buffer are scored, rows not yet visible are masked to -inf, and a fixed k =
min(index_topk, R) are taken; picks that are not visible are dropped (keep = False). While fewer
than k entries are visible every visible one is kept, as in the dynamic path; beyond, the same
top-k set is chosen, exact ties included: both paths break them by the same rule (the earlier
entry wins, `top_k_earliest`), and the masked rows sort after every visible one.

Legend: HI indexer heads, dI index head dim, R rows capacity, k picks.
"""

from __future__ import annotations

import torch

from ..indexer import index_scores, top_k_earliest


def select_fixed(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, row_ids: torch.Tensor,
                 visible: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [1, HI, dI], weights [1, HI], keys [R, dI], row_ids [R] (= arange), visible [1] (complete
    windows) -> (picks [1, k] int64 row indices, keep [1, k] bool: the pick is visible)."""
    k = min(topk, keys.shape[0])
    scores = index_scores(q, weights, keys)  # [1, R]
    future = row_ids >= visible[:, None]  # [1, R]
    picks = top_k_earliest(scores.masked_fill(future, float("-inf")), k)  # [1, k]
    return picks, picks < visible[:, None]
