"""The lightning indexer of CSA layers: which compressed entries each query attends to (docs/model.md 3.5).

score(t, w) = sum_h weight_h(t) * relu(qI_h(t) . K_w) / sqrt(dI), weight_h = (x Wp)_h / sqrt(HI).
Entries not yet complete at t ((w+1)*m > t+1) score -inf; the top min(index_topk, n) are kept and any
pick that is not visible is dropped (-1). When index_topk >= n every visible entry is kept.
Exact score ties (the relu makes many zeros) are broken by one rule, here and in the static decode
step: the earlier entry wins (`top_k_earliest`). transformers takes torch.topk, whose choice among
equal scores is unspecified (it depends on the tensor's shape and the kernel), so at an exact tie at
the k-th place the two may keep different, equally scored, rows; the exactness tests keep
index_topk >= the visible entries where they compare logits, and check selection apart.

On a GPU the scores are one Triton kernel (kernels/triton_indexer.py): it keeps the sum over heads in
registers and writes only [T, n] float32, the -inf mask applied there too, where the torch path below
passes several [T, HI, n] float32 tensors through memory (the matmul, its relu, the scaled and weighted
copies). On the CPU the torch path stays, its blocks small enough to stay in the cache. Both compute the
same scores up to float32 summation order, and both go through `masked_index_scores`.

Legend: T queries, HI indexer heads, dI index head dim, n compressed entries, k picks, ql q_lora_rank.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache

import torch

from .compressor import CompressorWeights
from .fp8_matrix import Matrix, linear
from .rope import apply_rope

# Bound on the float32 score elements (T x HI x n) materialized at once: long contexts score in query blocks.
SCORE_BLOCK_ELEMENTS = 1 << 24
# ...and on the CPU, where the scores' intermediates (the matmul's [Tb, HI, n] float32, its relu, scaled and
# head-weighted copies, then [Tb, n]) are each a fresh tensor: at 64 MiB a block the allocator maps new pages for
# every one of them and the kernel zeroes them on first touch, so a pass ran at 2 GB/s; at 4 MiB (1 << 20
# elements) they stay in the cache and the allocator's heap. Measured by bench/indexer_cost.py: a tiny-dims
# select of 800 queries over 7,500 rows 0.42 -> 0.24 s (1 thread). Blocking over queries changes no score.
CPU_SCORE_BLOCK_ELEMENTS = 1 << 20
# Device types whose scores the fused Triton kernel computes (GPUs); tests add "cpu" to run it in Triton's
# interpreter through the same calls.
FUSED_SCORE_DEVICES = ("cuda",)


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


@cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def fuses_scores(device: torch.device) -> bool:
    """Whether scores over keys on `device` are the fused Triton kernel's (on a GPU) rather than torch's."""
    return device.type in FUSED_SCORE_DEVICES and _has_triton()


def index_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [T, HI, dI], weights [T, HI], keys [n, dI] -> scores [T, n] float32."""
    if fuses_scores(keys.device):
        from ..kernels.triton_indexer import fused_index_scores  # Triton only where there is a GPU
        return fused_index_scores(q, weights, keys)
    s = torch.relu(torch.matmul(q.float(), keys.float().T)) * q.shape[-1] ** -0.5  # [T, HI, n]
    return (s * weights.unsqueeze(-1)).sum(dim=1)  # [T, n]


def masked_index_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor,
                        row_ids: torch.Tensor | None = None) -> torch.Tensor:
    """index_scores, -inf where entry w is not complete at query t (w >= visible[t]): visible [T] integer;
    row_ids [n] = arange(n) (a caller's buffer, or made here) -> [T, n] float32. The selection of the
    prefill and of the static decode step both score here: on a GPU one kernel, mask included."""
    if fuses_scores(keys.device):
        from ..kernels.triton_indexer import fused_index_scores
        return fused_index_scores(q, weights, keys, visible)
    if row_ids is None:
        row_ids = torch.arange(keys.shape[0], device=keys.device)  # [n]
    return index_scores(q, weights, keys).masked_fill(row_ids >= visible[:, None], float("-inf"))  # [T, n]


def score_block(heads: int, n: int, device: torch.device, limit: int | None = None) -> int:
    """Queries scored at once over n entries: the torch path's [Tb, HI, n] float32 intermediates kept under
    `limit` elements (default: CPU_SCORE_BLOCK_ELEMENTS on the CPU, to stay in the cache, else
    SCORE_BLOCK_ELEMENTS); the fused kernel's scores are only [Tb, n] (top-k's tensors beside them)."""
    if fuses_scores(device):
        return max(1, SCORE_BLOCK_ELEMENTS // max(1, n))
    if limit is None:
        limit = CPU_SCORE_BLOCK_ELEMENTS if device.type == "cpu" else SCORE_BLOCK_ELEMENTS
    return max(1, limit // max(1, heads * n))


def top_k_earliest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [..., n] -> indices [..., k] of the k largest, by descending score; among equal scores
    the lower index first (a stable sort keeps their order), so ties have one defined answer."""
    return scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]


def top_k_earliest_by_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """top_k_earliest's answer, the same indices in the same order, without sorting every score: a prefill's
    queries each rank every compressed entry, and at 100k tokens the full sorts took most of a CSA layer's
    time (n log n; this is topk's n log k and two passes). torch.topk finds the k-th largest score; a row
    with exactly k scores at or above it keeps those, and only they are sorted (stable: equal scores keep
    the lower index first). Rows where more scores tie at the k-th place (early queries, whose masked -inf
    entries tie) take the full sort, which decides which of the tied ones are kept."""
    lead, n = scores.shape[:-1], scores.shape[-1]
    flat = scores.reshape(-1, n)  # [R, n]
    kth = flat.topk(k, dim=-1).values[:, -1:]  # [R, 1]
    kept = flat >= kth  # [R, n], at least k per row (-0.0 >= 0.0: the sort ranks them equal too)
    at = kept.nonzero()  # [m, 2] row-major: each row's indices ascending
    rows = at[:, 0].bincount(minlength=flat.shape[0])  # [R] kept per row
    if bool((rows == k).all()):
        idx = at[:, 1].view(-1, k)  # [R, k]
    else:
        idx = torch.empty(flat.shape[0], k, dtype=torch.long, device=flat.device)
        exact = rows == k
        idx[exact] = at[exact[at[:, 0]], 1].view(-1, k)
        idx[~exact] = top_k_earliest(flat[~exact], k)
    order = flat.gather(1, idx).sort(dim=-1, descending=True, stable=True).indices  # [R, k]
    return idx.gather(1, order).view(*lead, k)


def select(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, ratio: int,
           topk: int) -> torch.Tensor:
    """Top-k visible entries per query -> indices [T, k] int64, -1 where the pick is not visible."""
    t, h = weights.shape
    n = keys.shape[0]
    k = min(topk, n)
    visible = (positions + 1) // ratio  # [T] number of complete windows at t
    block = score_block(h, n, keys.device)
    picks = []
    for s in range(0, t, block):
        scores = masked_index_scores(q[s:s + block], weights[s:s + block], keys, visible[s:s + block])  # [Tb, n]
        idx = top_k_earliest_by_topk(scores, k)  # [Tb, k]
        picks.append(torch.where(idx >= visible[s:s + block, None], -1, idx))
    return torch.cat(picks)  # [T, k]
