"""Pure-torch float32 reference of the routed experts (docs/model.md 2.2 and 3, MoE step 4-5).

Legend: T = tokens, D = hidden, I = expert intermediate, n = routes of one expert.
"""

from __future__ import annotations

import torch

from ostinato.checkpoint.formats import dequantize_mxfp4
from ostinato.checkpoint.reader import PackedExpert

from .routes import GroupedRoutes


def dequantize_expert(e: PackedExpert) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w1 [I, D], w3 [I, D], w2 [D, I]) in float32: exact (docs/model.md 2.2)."""
    return (dequantize_mxfp4(e.w1, e.w1_scale), dequantize_mxfp4(e.w3, e.w3_scale),
            dequantize_mxfp4(e.w2, e.w2_scale))


def expert_forward(x: torch.Tensor, dense: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                   limit: float) -> torch.Tensor:
    """x [n, D] float32, dense (w1, w3, w2) -> [n, D]: silu(min(x w1^T, L)) * clamp(x w3^T, -L, L), then w2."""
    w1, w3, w2 = dense
    g = (x @ w1.T).clamp(max=limit)          # [n, I]
    u = (x @ w3.T).clamp(-limit, limit)      # [n, I]
    return (torch.nn.functional.silu(g) * u) @ w2.T  # [n, D]


def moe_experts_reference(x: torch.Tensor, routes: GroupedRoutes, experts: list[PackedExpert], out: torch.Tensor,
                          limit: float = 10.0, dense: list | None = None) -> torch.Tensor:
    """out [T, D] float32 += sum over routes of weight * expert(x[token]); returns out.
    dense: optional dequantize_expert() results, reused across calls (tests with large experts)."""
    x = x.float()
    for e, expert in enumerate(experts):
        lo, hi = int(routes.offsets[e]), int(routes.offsets[e + 1])
        if hi == lo:
            continue
        tok = routes.token[lo:hi]                                   # [n]
        w = dense[e] if dense is not None else dequantize_expert(expert)
        y = expert_forward(x[tok], w, limit) * routes.weight[lo:hi, None]  # [n, D]
        out.index_add_(0, tok, y)
    return out
