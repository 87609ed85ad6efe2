"""Attention's decode step at a fixed shape (static twin of ../attention.py).

The same projections, softmax with sinks and grouped output as the dynamic path (shared functions);
only the key sets are read from the static buffers:
- window: the token's key goes to ring slot p mod W, then the W slots are gathered in position
  order p-W+1 .. p; positions before the context, or not held by their slot, are masked;
- HCA: all R rows, masked beyond the (p+1) // m visible ones;
- CSA: the k rows the fixed-shape indexer picks, gathered, dropped picks masked.

Legend: H heads, hd head_dim, W sliding_window, R rows capacity, k CSA picks, D hidden, ql q_lora_rank.
"""

from __future__ import annotations

import torch

from ..attention import AttentionWeights, attend_and_project, project_qkv
from ..indexer import index_queries
from ..rope import Rope
from .compressor import compressor_step
from .indexer import select_fixed
from .state import LayerState

NEG_INF = float("-inf")


def attention_step(w: AttentionWeights, state: LayerState, x: torch.Tensor, rope: Rope, eps: float) -> torch.Tensor:
    """x [1, D] at position state.position -> [1, D]; updates the layer's static buffers."""
    cos, sin = rope.cos_sin(state.position)  # [1, R/2] each
    qr, q, kv = project_qkv(w, x, cos, sin, eps)  # [1, ql], [1, H, hd], [1, hd]
    lw, vw = window_keys(w, state, q, kv)
    lc, vc = compressed_keys(w, state, q, qr, x, rope, cos, sin, eps) if w.compressor else (None, None)
    return attend_and_project(w, lw, vw, lc, vc, cos, sin)


def window_keys(w: AttentionWeights, state: LayerState, q: torch.Tensor, kv: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Write kv [1, hd] into the ring -> (logits [1, H, W] float32, values [1, W, hd])."""
    pos, W, hd = state.position, w.window, w.head_dim
    slot = pos % W  # [1]
    state.window.index_copy_(0, slot, kv)
    state.window_pos.index_copy_(0, slot, pos)
    wanted = pos + state.window_offsets  # [W] positions p-W+1 .. p (negative: before the context)
    ring = wanted % W  # [W]
    keys = state.window.index_select(0, ring).unsqueeze(0)  # [1, W, hd] in position order
    valid = (state.window_pos.index_select(0, ring) == wanted) & (wanted >= 0)  # [W]: held, and in the context
    logits = torch.bmm(q, keys.transpose(1, 2)).float() * hd ** -0.5  # [1, H, W]
    return logits.masked_fill(~valid, NEG_INF), keys


def compressed_keys(w: AttentionWeights, state: LayerState, q: torch.Tensor, qr: torch.Tensor, x: torch.Tensor,
                    rope: Rope, cos: torch.Tensor, sin: torch.Tensor, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance the compressors -> HCA (logits [1, H, R], rows [R, hd]) or CSA (logits [1, H, k],
    picked rows [1, k, hd])."""
    c, ix, pos = w.compressor, w.indexer, state.position
    scale = w.head_dim ** -0.5
    compressor_step(c, state.comp, x, pos, rope, eps)
    visible = (pos + 1) // c.ratio  # [1] complete windows
    rows = state.comp.rows  # [R, hd]
    if ix is None:  # HCA: every visible entry
        future = state.comp.row_ids >= visible  # [R]
        return ((q @ rows.T).float() * scale).masked_fill(future, NEG_INF), rows
    compressor_step(ix.compressor, state.index, x, pos, rope, eps)
    qi, hw = index_queries(ix, qr, x, cos, sin)  # [1, HI, dI], [1, HI]
    picks, keep = select_fixed(qi, hw, state.index.rows, state.index.row_ids, visible, ix.topk)  # [1, k] each
    picked = rows.index_select(0, picks[0]).unsqueeze(0)  # [1, k, hd]
    logits = torch.bmm(q, picked.transpose(1, 2)).float() * scale  # [1, H, k]
    return logits.masked_fill(~keep[:, None, :], NEG_INF), picked
