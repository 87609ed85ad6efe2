"""Products with a bf16 matrix held as the checkpoint stores it, in float32 arithmetic: the LM head's and the
compressors' projections' (docs/model.md 3.4, 3.7: the reference computes both in float32).

A bf16 value is a float32 value, so x @ widen(W)^T in float32 needs no float32 copy of W: each path reads the
rows as stored and gives the float32 product's values up to summation order (products of a bf16 x, a bf16
plan's, are exact in float32):
- a few tokens with a plan's kernels active: the head kernel (kernels/dense_ops.py `head_logits`), one op;
- one token of a step torch.compile traces, on a small matrix: row dots, which Inductor generates fused with
  their neighbours (fp8_matrix.py's rule, ROW_DOT_MAX_ELEMENTS);
- otherwise blocks of rows widened to float32 (on the CPU a slab at a time into one buffer, bf16_widening.py; a
  matrix no larger than a slab widened whole, in 3 dispatched ops where the slabs take ~10).
Holding them as stored halves what a decode token reads of them (V4-Flash's compressors: 59 MB a token of a
4-layer slice in float32; 1.00 ms through the head kernel against 2.97 ms as float32 matmuls, 2 Zen 4 cores).

Legend: T tokens, K inputs, N rows of W.
"""

from __future__ import annotations

import torch

from . import bf16_widening
from .fp8_matrix import ROW_DOT_MAX_ELEMENTS
from .fused import active, inductor_generates

BLOCK_ROWS = 16384  # rows per float32 block off the CPU (256 MB at V4-Flash's hidden 4,096)


def stored_product(x: torch.Tensor, w: torch.Tensor, row_dots: bool = True) -> torch.Tensor:
    """x [T, K] (float32, or bf16) @ W [N, K]^T (bf16 as stored, or float32) -> [T, N] float32. `row_dots`: a
    small matrix in a compiled step may be read as row dots (the head keeps the plan's kernel, Model.head)."""
    if row_dots and inductor_generates() and x.shape[0] == 1 and w.numel() <= ROW_DOT_MAX_ELEMENTS:
        return (x.float().unsqueeze(-2) * w).sum(-1)  # [1, 1, K] * [N, K] -> [1, N], widened in the generated loop
    kernels = active()
    if kernels is not None and kernels.takes_head(x, w):
        return kernels.head_logits(x, w)
    x = x.float()
    if x.device.type == "cpu":
        if w.numel() <= bf16_widening.SLAB_ELEMENTS:  # one slab's size: widened whole, a third of the ops
            return x @ w.float().T
        return bf16_widening.slab_product(x, w.shape[0], lambda r0, r1, part: part.copy_(w[r0:r1]))
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)  # [T, N]
    for r in range(0, w.shape[0], BLOCK_ROWS):
        out[:, r:r + BLOCK_ROWS] = x @ w[r:r + BLOCK_ROWS].float().T
    return out
