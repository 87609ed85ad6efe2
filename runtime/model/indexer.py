"""The lightning indexer of CSA layers: which compressed entries each query attends to (docs/model.md 3.5).

score(t, w) = sum_h weight_h(t) * relu(qI_h(t) . K_w) / sqrt(dI), weight_h = (x Wp)_h / sqrt(HI).
Entries not yet complete at t ((w+1)*m > t+1) score -inf; the top min(index_topk, n) are kept and any
pick that is not visible is dropped (-1). When index_topk >= n every visible entry is kept.
Exact score ties (the relu makes many zeros) are broken by one rule, here and in the static decode
step: the earlier entry wins (`top_k_earliest`). transformers takes torch.topk, whose choice among
equal scores is unspecified (it depends on the tensor's shape and the kernel), so at an exact tie at
the k-th place the two may keep different, equally scored, rows; the exactness tests keep
index_topk >= the visible entries where they compare logits, and check selection apart.

Legend: T queries, HI indexer heads, dI index head dim, n compressed entries, k picks, ql q_lora_rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .compressor import CompressorWeights
from .fp8_matrix import Matrix, linear
from .rope import apply_rope

# Bound on the float32 score elements (T x HI x n) materialized at once: long contexts score in query blocks.
SCORE_BLOCK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class IndexerWeights:
    wq_b: Matrix                # [HI*dI, ql] compute dtype, or FP8 as stored
    weights_proj: torch.Tensor  # [HI, D] float32
    compressor: CompressorWeights  # index keys: the same compressor procedure at width dI
    n_heads: int
    head_dim: int
    topk: int


def index_queries(w: IndexerWeights, qr: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """qr [T, ql] (normed q latent), x [T, D] -> (roped queries [T, HI, dI], head weights [T, HI] float32)."""
    q = linear(qr, w.wq_b).view(qr.shape[0], w.n_heads, w.head_dim)  # [T, HI, dI]
    q = apply_rope(q, cos, sin)
    weights = linear(x.float(), w.weights_proj) * w.n_heads ** -0.5  # [T, HI]
    return q, weights


def index_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [T, HI, dI], weights [T, HI], keys [n, dI] -> scores [T, n] float32."""
    s = torch.relu(torch.matmul(q.float(), keys.float().T)) * q.shape[-1] ** -0.5  # [T, HI, n]
    return (s * weights.unsqueeze(-1)).sum(dim=1)  # [T, n]


def top_k_earliest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [..., n] -> indices [..., k] of the k largest, by descending score; among equal scores
    the lower index first (a stable sort keeps their order), so ties have one defined answer."""
    return scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]


def select(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, ratio: int,
           topk: int) -> torch.Tensor:
    """Top-k visible entries per query -> indices [T, k] int64, -1 where the pick is not visible."""
    t, h = weights.shape
    n = keys.shape[0]
    k = min(topk, n)
    visible = (positions + 1) // ratio  # [T] number of complete windows at t
    block = max(1, SCORE_BLOCK_ELEMENTS // max(1, h * n))
    picks = []
    for s in range(0, t, block):
        scores = index_scores(q[s:s + block], weights[s:s + block], keys)  # [Tb, n]
        future = torch.arange(n, device=keys.device) >= visible[s:s + block, None]  # [Tb, n]
        idx = top_k_earliest(scores.masked_fill(future, float("-inf")), k)  # [Tb, k]
        picks.append(torch.where(idx >= visible[s:s + block, None], -1, idx))
    return torch.cat(picks)  # [T, k]
