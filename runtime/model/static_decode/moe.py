"""The MoE block's static step (T tokens): routing recorded into static buffers, routed experts by the executor.

Executors may offer a capturable `decode_step` (same contract as calling them: layer, x [T, D],
expert ids [T, k], weights [T, k] -> [T, D]); otherwise the executor itself runs (eagerly only:
the plain DenseExpertExecutor reads counts on the host). The routing observer is not called: the
host reads the recorded ids after the step instead.

Legend: T tokens, D hidden, k experts per token.
"""

from __future__ import annotations

import torch

from ..experts import ExpertExecutor
from ..fused import inductor_generates
from ..moe import MoeWeights, shared_expert
from ..router import route


def expert_step(executor: ExpertExecutor):
    """The executor's fixed-shape decode entry point if it has one, else the executor; while torch.compile
    traces a step, its op form (one opaque call, engine/cpu_step.py)."""
    if inductor_generates() and hasattr(executor, "decode_op"):
        return executor.decode_op
    return getattr(executor, "decode_step", executor)


def moe_step(w: MoeWeights, layer: int, x: torch.Tensor, token: torch.Tensor, executor: ExpertExecutor,
             ids_out: torch.Tensor, weights_out: torch.Tensor) -> torch.Tensor:
    """x [T, D] (normed), token [T] -> [T, D]; writes the routes into ids_out / weights_out [T, k]."""
    ids, weights = route(w.router, x, token)  # [T, k], [T, k]
    ids_out.copy_(ids)
    weights_out.copy_(weights)
    return expert_step(executor)(layer, x, ids, weights) + shared_expert(w, x)
