"""The MoE block's decode step: routing recorded into static buffers, routed experts by the executor.

Executors may offer a capturable `decode_step` (same contract as calling them: layer, x [1, D],
expert ids [1, k], weights [1, k] -> [1, D]); otherwise the executor itself runs (eagerly only:
the plain DenseExpertExecutor reads counts on the host). The routing observer is not called: the
host reads the recorded ids after the step instead.

Legend: D hidden, k experts per token.
"""

from __future__ import annotations

import torch

from ..experts import ExpertExecutor
from ..moe import MoeWeights, shared_expert
from ..router import route


def expert_step(executor: ExpertExecutor):
    """The executor's fixed-shape decode entry point if it has one, else the executor."""
    return getattr(executor, "decode_step", executor)


def moe_step(w: MoeWeights, layer: int, x: torch.Tensor, token: torch.Tensor, executor: ExpertExecutor,
             ids_out: torch.Tensor, weights_out: torch.Tensor) -> torch.Tensor:
    """x [1, D] (normed), token [1] -> [1, D]; writes the routes into ids_out / weights_out [k]."""
    ids, weights = route(w.router, x, token)  # [1, k], [1, k]
    ids_out.copy_(ids[0])
    weights_out.copy_(weights[0])
    return expert_step(executor)(layer, x, ids, weights) + shared_expert(w, x)
