"""DeepSeek-V4 attention for all three layer kinds, on top of a LayerCache (docs/model.md section 3).

One shared K=V head (MQA). Keys of query t: the sliding window (positions t-W < s <= t) plus, in
CSA/HCA layers, compressed entries: all complete ones (HCA) or the indexer's picks (CSA). A per-head
sink logit joins the softmax denominator only. The output's rope channels are rotated back by -t
(values carry rope too), then heads go through the grouped low-rank output projection.

Memory per call is bounded whatever the context: the cache updates (window, compressor rows, index
keys) take the whole chunk, then queries attend in blocks whose logits (H x keys per query) and
gathered CSA values (k x hd per query) stay under ATTENTION_BLOCK_ELEMENTS: at V4-Flash's 64 heads x
512 dims a 4,096-token chunk would otherwise hold gigabytes. Keys per query: the window W, plus n
(HCA, and CSA while scoring every entry densely is cheaper than gathering k) or k (CSA, gathered).

Legend: T new tokens, H heads, hd head_dim, ql q_lora_rank, G o_groups, ol o_lora_rank,
W sliding_window, n compressed entries, k CSA picks, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .bf16_widening import product
from .compressor import CompressorWeights, compress
from .fp8_matrix import Matrix, grouped_linear, linear
from .indexer import IndexerWeights, index_queries, select
from .kv_cache import LayerCache
from .norms import rms_norm, unweighted_rms_norm
from .rope import Rope, apply_rope

# CSA scores every compressed entry and masks the unpicked ones while that costs no more than
# gathering each query's k picked rows (n * H <= ratio * k * hd); beyond, it gathers.
CSA_DENSE_MAX_RATIO = 1.0
# Elements (logits, gathered values) one block of queries may materialize at once.
ATTENTION_BLOCK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class AttentionWeights:
    wq_a: Matrix           # [ql, D] compute dtype, or FP8 as stored (fp8_matrix.py)
    q_norm: torch.Tensor   # [ql] float32
    wq_b: Matrix           # [H*hd, ql]
    wkv: Matrix            # [hd, D]
    kv_norm: torch.Tensor  # [hd] float32
    wo_a: Matrix           # [G*ol, H*hd/G]: rows g*ol..(g+1)*ol read group g's heads
    wo_b: Matrix           # [D, G*ol]
    sink: torch.Tensor     # [H] float32
    compressor: CompressorWeights | None  # CSA (ratio 4) and HCA (ratio 128)
    indexer: IndexerWeights | None        # CSA only
    n_heads: int
    head_dim: int
    o_groups: int
    window: int


def attention(w: AttentionWeights, x: torch.Tensor, positions: torch.Tensor, cache: LayerCache, rope: Rope,
              eps: float) -> torch.Tensor:
    """x [T, D] at contiguous `positions` [T] after what `cache` holds -> [T, D]; updates the cache."""
    cos, sin = rope.cos_sin(positions)  # [T, R/2] each
    qr, q, kv = project_qkv(w, x, cos, sin, eps)
    band, valid = _window(w, kv, cache)  # [T, W, hd] view, [T, W]
    rows, picks = _extend_compressed(w, qr, x, positions, cache, rope, cos, sin, eps)  # [n, hd], [T, k]
    per_query = w.n_heads * (w.window + 1)
    if rows is not None:
        gathered = picks is not None and not _csa_dense(w, rows.shape[0], picks.shape[1])
        per_query += w.n_heads * picks.shape[1] + picks.shape[1] * w.head_dim if gathered else \
            w.n_heads * rows.shape[0]
    block = max(1, ATTENTION_BLOCK_ELEMENTS // per_query)
    out = []
    for s in range(0, x.shape[0], block):
        e = s + block
        vw = band[s:e].contiguous()  # [Tb, W, hd]: the block's windows, one copy of whole rows
        lw = _window_logits(w, q[s:e], vw, valid[s:e])  # [Tb, H, W]
        lc, vc = _compressed_logits(w, q[s:e], positions[s:e], rows, None if picks is None else picks[s:e])
        out.append(attend_and_project(w, lw, vw, lc, vc, cos[s:e], sin[s:e]))  # [Tb, D]
    return torch.cat(out)  # [T, D]


def project_qkv(w: AttentionWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, D] -> (q latent qr [T, ql], roped queries q [T, H, hd], roped key=value kv [T, hd])."""
    t, H, hd = x.shape[0], w.n_heads, w.head_dim
    qr = rms_norm(linear(x, w.wq_a), w.q_norm, eps)  # [T, ql]
    q = unweighted_rms_norm(linear(qr, w.wq_b).view(t, H, hd), eps)  # [T, H, hd]
    q = apply_rope(q, cos, sin)
    kv = apply_rope(rms_norm(linear(x, w.wkv), w.kv_norm, eps), cos, sin)  # [T, hd]
    return qr, q, kv


def attend_and_project(w: AttentionWeights, lw: torch.Tensor, vw: torch.Tensor, lc: torch.Tensor | None,
                       vc: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One softmax over window logits lw [T, H, W], compressed logits lc [T, H, n|k] (or None) and the
    sinks; values vw [T, W, hd] and vc ([n, hd] or [T, k, hd]); rope undone, grouped output -> [T, D]."""
    t, H = lw.shape[:2]
    sink = w.sink.view(1, H, 1).expand(t, H, 1)  # [T, H, 1]: joins the denominator only
    logits = torch.cat([lw] + ([lc] if lc is not None else []) + [sink], dim=-1)  # [T, H, W (+n|k) + 1]
    probs = torch.softmax(logits, dim=-1).to(vw.dtype)  # softmax takes the row maximum out itself
    W = w.window
    o = product(probs[..., :W], vw)  # [T, H, hd]
    if lc is not None:
        p_c = probs[..., W:-1]  # [T, H, n|k]
        o = o + product(p_c, vc)
    o = apply_rope(o, cos, sin, inverse=True)

    G = w.o_groups
    grouped = o.reshape(t, G, -1).transpose(0, 1)  # [G, T, H*hd/G]
    z = grouped_linear(grouped, w.wo_a)  # [G, T, ol]
    return linear(z.transpose(0, 1).reshape(t, -1), w.wo_b)  # [T, D]


def _window(w: AttentionWeights, kv: torch.Tensor, cache: LayerCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding branch, banded: query i sees rows i..i+W-1 of [pad ; cached W-1 rows ; new rows], a
    strided view, so the cost is T x W per head instead of T x (W-1+T). Pad rows stand for positions
    < 0 and are masked. Returns (each query's window keys = values [T, W, hd], a view; valid [T, W]);
    updates cache.window."""
    t, hd, W = kv.shape[0], w.head_dim, w.window
    n_prev = cache.window.shape[0]
    keys = torch.cat((cache.window, kv))  # [n_prev+T, hd]
    cache.window = keys[max(0, keys.shape[0] - (W - 1)):].clone()  # [<= W-1, hd]
    pad = W - 1 - n_prev
    padded = torch.cat((keys.new_zeros(pad, hd), keys)) if pad else keys  # [W-1+T, hd]
    valid = (torch.arange(t, device=kv.device)[:, None] + torch.arange(W, device=kv.device)) >= pad  # [T, W]
    return padded.unfold(0, W, 1).transpose(1, 2), valid  # [T, hd, W] -> [T, W, hd]: query i's window


def _window_logits(w: AttentionWeights, q: torch.Tensor, vw: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Logits of queries q [Tb, H, hd] over their windows vw [Tb, W, hd] (contiguous: the product reads it
    transposed in place, where the band view itself would be gathered element by element) -> [Tb, H, W] float32."""
    logits = product(q, vw.transpose(1, 2)).float() * w.head_dim ** -0.5  # [Tb, H, W]
    return logits.masked_fill(~valid[:, None, :], float("-inf"))


def _extend_compressed(w: AttentionWeights, qr: torch.Tensor, x: torch.Tensor, positions: torch.Tensor,
                       cache: LayerCache, rope: Rope, cos: torch.Tensor, sin: torch.Tensor, eps: float
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Compressed branch, whole chunk: extend the rows (and CSA index keys), pick each query's entries
    -> (rows [n, hd], CSA picks [T, k] or None for HCA), or (None, None) with no compressed entry yet."""
    c, ix = w.compressor, w.indexer
    if c is None:
        return None, None
    entries, cache.comp = compress(c, x, cache.comp, cache.rows.n, rope, eps)
    cache.rows.append(entries)
    if ix is not None:
        ientries, cache.index_comp = compress(ix.compressor, x, cache.index_comp, cache.index_rows.n, rope, eps)
        cache.index_rows.append(ientries)
    rows = cache.rows.view()  # [n, hd]
    if rows.shape[0] == 0:
        return None, None
    if ix is None:
        return rows, None
    qi, hw = index_queries(ix, qr, x, cos, sin)
    return rows, select(qi, hw, cache.index_rows.view(), positions, c.ratio, ix.topk)  # [T, k]


def _csa_dense(w: AttentionWeights, n: int, k: int) -> bool:
    return n * w.n_heads <= CSA_DENSE_MAX_RATIO * k * w.head_dim


def _compressed_logits(w: AttentionWeights, q: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None,
                       picks: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Logits of queries q [Tb, H, hd] over the compressed entries each may use -> (logits [Tb, H, n|k]
    float32, values [n, hd] or [Tb, k, hd]), or (None, None)."""
    if rows is None:
        return None, None
    t, n, scale = q.shape[0], rows.shape[0], w.head_dim ** -0.5
    if picks is None:  # HCA: every complete entry
        future = torch.arange(n, device=q.device) >= ((positions + 1) // w.compressor.ratio)[:, None]  # [Tb, n]
        return (product(q, rows.T).float() * scale).masked_fill(future[:, None, :], float("-inf")), rows  # [Tb, H, n]
    if _csa_dense(w, n, picks.shape[1]):
        # Few entries: score them all and mask the unpicked (cheaper than gathering Tb x k rows).
        chosen = torch.zeros(t, n + 1, dtype=torch.bool, device=q.device)  # [Tb, n+1], column n: dropped picks
        chosen.scatter_(1, torch.where(picks < 0, n, picks), True)
        return (product(q, rows.T).float() * scale).masked_fill(~chosen[:, None, :n], float("-inf")), rows  # [Tb, H, n]
    picked = rows[picks.clamp(min=0)]  # [Tb, k, hd]
    logits = product(q, picked.transpose(1, 2)).float() * scale  # [Tb, H, k]
    return logits.masked_fill((picks < 0)[:, None, :], float("-inf")), picked
