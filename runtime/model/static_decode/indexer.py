"""The lightning indexer's selection at a fixed shape (static twin of ../indexer.py `select`), per query.

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

from ..indexer import SCORE_BLOCK_ELEMENTS, masked_index_scores, score_block, top_k_earliest


def select_fixed(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, row_ids: torch.Tensor,
                 visible: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, HI, dI], weights [T, HI], keys [R, dI], row_ids [R] (= arange), visible [T] (complete
    windows per query) -> (picks [T, k] int64 row indices, keep [T, k] bool: the pick is visible).
    Queries are scored in blocks (a static size: it depends on shapes and the device only) so that the torch
    path's T x HI x R float32 scores stay under SCORE_BLOCK_ELEMENTS (the fused kernel's on a GPU: T x R)."""
    t, h = weights.shape
    k = min(topk, keys.shape[0])
    block = score_block(h, keys.shape[0], keys.device, SCORE_BLOCK_ELEMENTS)
    picks = []
    for s in range(0, t, block):
        scores = masked_index_scores(q[s:s + block], weights[s:s + block], keys, visible[s:s + block], row_ids)
        picks.append(top_k_earliest(scores, k))  # [Tb, R] -> [Tb, k]
    picks = picks[0] if len(picks) == 1 else torch.cat(picks)  # [T, k]
    return picks, picks < visible[:, None]
