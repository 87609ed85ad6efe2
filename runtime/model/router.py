"""MoE routing: sqrt(softplus) scores, bias-corrected top-k or hash routing (docs/model.md section 3, MoE).

Score routing: experts = top-k(s + bias) where s = sqrt(softplus(x Wg)); the bias only selects.
Hash routing (first num_hash_layers layers): experts = tid2eid[token]. Either way the weights are the
selected unbiased scores, normalized to sum 1 and multiplied by routed_scaling_factor.
Routing runs in float32 whatever the compute dtype (the reference does; it keeps bf16 selections
close to float32 ones).

Legend: T tokens, D hidden, E routed experts, k experts per token, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .fp8_matrix import linear


@dataclass(frozen=True)
class RouterWeights:
    gate: torch.Tensor            # [E, D] float32
    bias: torch.Tensor | None     # [E] float32 (score routing)
    tid2eid: torch.Tensor | None  # [V, k] int64 (hash routing)
    top_k: int
    scaling: float


def route(w: RouterWeights, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D], token_ids [T] -> (expert ids [T, k] int64, weights [T, k] float32)."""
    scores = F.softplus(linear(x.float(), w.gate)).sqrt()  # [T, E]
    if w.tid2eid is not None:
        ids = w.tid2eid[token_ids]  # [T, k]
    else:
        ids = torch.topk(scores + w.bias, w.top_k, dim=-1, sorted=False).indices  # [T, k]
    weights = scores.gather(1, ids)  # [T, k]
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * w.scaling
