"""Attention's step at a fixed shape (static twin of ../attention.py), for T new tokens.

The same projections, softmax with sinks and grouped output as the dynamic path (shared functions);
only the key sets are read from the static buffers:
- window: the W-1 positions before the first new token are gathered from the ring in position
  order (slot = position mod W), the new keys appended, and query i sees rows i .. i+W-1 of that
  band (as the dynamic path); positions before the context, or not held by their slot, are masked.
  Then the last min(T, W) new keys go into the ring (distinct slots). The decode step (T = 1) writes
  its key first and reads the whole window from the ring: fewer ops on every generated token;
- HCA: all R rows, masked per query beyond its (p+1) // m visible ones;
- CSA: the k rows the fixed-shape indexer picks per query, gathered, dropped picks masked.
T = 1 is the decode step.

Legend: T new tokens, H heads, hd head_dim, W sliding_window, R rows capacity, k CSA picks, D hidden,
ql q_lora_rank.
"""

from __future__ import annotations

import torch

from ..attention import AttentionWeights, attend_and_project, project_qkv
from ..bf16_widening import product
from ..indexer import index_queries
from ..rope import Rope
from .compressor import compressor_step
from .indexer import select_fixed
from .state import LayerState

NEG_INF = float("-inf")


def attention_step(w: AttentionWeights, state: LayerState, x: torch.Tensor, positions: torch.Tensor, rope: Rope,
                   eps: float) -> torch.Tensor:
    """x [T, D] at consecutive positions [T] (the first = state.position) -> [T, D]; updates the buffers."""
    cos, sin = rope.cos_sin(positions)  # [T, R/2] each
    qr, q, kv = project_qkv(w, x, cos, sin, eps)  # [T, ql], [T, H, hd], [T, hd]
    lw, vw = window_keys(w, state, q, kv, positions)
    lc, vc = compressed_keys(w, state, q, qr, x, positions, rope, cos, sin, eps) if w.compressor else (None, None)
    return attend_and_project(w, lw, vw, lc, vc, cos, sin)


def window_keys(w: AttentionWeights, state: LayerState, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys kv [T, hd] at positions [T] -> (logits [T, H, W] float32, values [T, W, hd]); writes the ring."""
    W, hd, t = w.window, w.head_dim, kv.shape[0]
    if t == 1:
        return _decode_window_keys(w, state, q, kv, positions)
    before = positions[:1] + state.window_offsets[:-1]  # [W-1] positions p-W+1 .. p-1 (negative: none)
    ring = before % W  # [W-1]
    held = (state.window_pos.index_select(0, ring) == before) & (before >= 0)  # [W-1] in the ring and the context
    keys = torch.cat((state.window.index_select(0, ring), kv.to(state.window.dtype)))  # [W-1+T, hd]
    valid = torch.cat((held, held.new_ones(t)))  # [W-1+T]
    band = keys.unfold(0, W, 1)  # [T, hd, W] view: query i's window
    logits = product(q, band).float() * hd ** -0.5  # [T, H, W]
    logits = logits.masked_fill(~valid.unfold(0, W, 1)[:, None, :], NEG_INF)
    keep = min(t, W)  # the next steps need only the last W-1 keys
    slots = positions[t - keep:] % W  # [keep] distinct
    state.window.index_copy_(0, slots, kv[t - keep:].to(state.window.dtype))
    state.window_pos.index_copy_(0, slots, positions[t - keep:])
    return logits, band.transpose(1, 2)


def _decode_window_keys(w: AttentionWeights, state: LayerState, q: torch.Tensor, kv: torch.Tensor,
                        positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """T = 1, the decode step's path (10 fewer ops than the band, on every token): write the key first,
    then the ring holds the whole window p-W+1 .. p."""
    W, hd = w.window, w.head_dim
    slot = positions % W  # [1]
    state.window.index_copy_(0, slot, kv.to(state.window.dtype))
    state.window_pos.index_copy_(0, slot, positions)
    wanted = positions + state.window_offsets  # [W] positions p-W+1 .. p (negative: before the context)
    ring = wanted % W  # [W]
    keys = state.window.index_select(0, ring).unsqueeze(0)  # [1, W, hd] in position order
    valid = (state.window_pos.index_select(0, ring) == wanted) & (wanted >= 0)  # [W]: held, and in the context
    logits = product(q, keys.transpose(1, 2)).float() * hd ** -0.5  # [1, H, W]
    return logits.masked_fill(~valid, NEG_INF), keys


def compressed_keys(w: AttentionWeights, state: LayerState, q: torch.Tensor, qr: torch.Tensor, x: torch.Tensor,
                    positions: torch.Tensor, rope: Rope, cos: torch.Tensor, sin: torch.Tensor, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance the compressors -> HCA (logits [T, H, R], rows [R, hd]) or CSA (logits [T, H, k],
    picked rows [T, k, hd])."""
    c, ix = w.compressor, w.indexer
    scale = w.head_dim ** -0.5
    compressor_step(c, state.comp, x, positions, rope, eps)
    visible = (positions + 1) // c.ratio  # [T] complete windows per query
    rows = state.comp.rows  # [R, hd]
    if ix is None:  # HCA: every visible entry
        future = state.comp.row_ids >= visible[:, None]  # [T, R]
        return (product(q, rows.T).float() * scale).masked_fill(future[:, None, :], NEG_INF), rows
    compressor_step(ix.compressor, state.index, x, positions, rope, eps)
    qi, hw = index_queries(ix, qr, x, cos, sin)  # [T, HI, dI], [T, HI]
    picks, keep = select_fixed(qi, hw, state.index.rows, state.index.row_ids, visible, ix.topk)  # [T, k] each
    t, k = picks.shape
    picked = rows.index_select(0, picks.reshape(-1)).view(t, k, -1)  # [T, k, hd]
    logits = product(q, picked.transpose(1, 2)).float() * scale  # [T, H, k]
    return logits.masked_fill(~keep[:, None, :], NEG_INF), picked
