"""The MoE block: route, hand the routes to the expert executor, add the shared expert.

An optional observer sees every forward's routes (layer, token ids, expert ids) so a profiler can
count them without touching the model.

Legend: T tokens, D hidden, I moe_intermediate_size, k experts per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .experts import ExpertExecutor, swiglu
from .fp8_matrix import Matrix, linear
from .router import RouterWeights, route

RoutingObserver = Callable[[int, torch.Tensor, torch.Tensor], None]  # (layer, token_ids [T], expert_ids [T, k])


@dataclass(frozen=True)
class MoeWeights:
    router: RouterWeights
    shared_w13: Matrix        # [2I, D] gate rows then up rows (compute dtype, or FP8 as stored)
    shared_w2: Matrix         # [D, I]
    limit: float


def moe(w: MoeWeights, layer: int, x: torch.Tensor, token_ids: torch.Tensor, executor: ExpertExecutor,
        observer: RoutingObserver | None = None) -> torch.Tensor:
    """x [T, D] (normed), token_ids [T] -> [T, D]."""
    ids, weights = route(w.router, x, token_ids)  # [T, k], [T, k]
    if observer is not None:
        observer(layer, token_ids, ids)
    routed = executor(layer, x, ids, weights)  # [T, D]
    return routed + shared_expert(w, x)


def shared_expert(w: MoeWeights, x: torch.Tensor) -> torch.Tensor:
    """x [T, D] -> [T, D]: the always-on expert (same SwiGLU, unweighted)."""
    return linear(swiglu(linear(x, w.shared_w13), w.limit), w.shared_w2)
