"""What the cost model is fed: each layer's placement and dense weights, the MTP block's, and what the dense format
the plan holds them in says about the shared expert.

The compiler's cost_model pass builds these from the plan (compiler/passes/cost_model.py); the session simulator
and the tests build them by hand, so every input is explicit here and nothing is read from a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.tensor_specs import layer_specs

from ..memory_model import DENSE_FORMATS, held_bytes, layer_dense_bytes


@dataclass(frozen=True)
class LayerCostInputs:
    gpu: int
    dense_bytes: int              # weights read per forward on the GPU
    dense_params: int             # multiply-adds per token of the dense matmuls
    hot: np.ndarray               # [E] bool
    share: np.ndarray             # [E] float, route share of each expert (sums to 1)


@dataclass(frozen=True)
class MtpCostInputs:
    """The MTP block's dense part (its decoder layer's dense weights, e_proj, h_proj, norms, mHC head):
    bytes read per forward and multiply-adds per token, on the GPU holding the head (mtp.py runs it on
    the last layer's device); its routed experts as placed, `hot` [E] bool with the route `share` [E]
    of its profile row (summing to 1); without them, priced as an average layer's (CostModel.mtp_draft)."""
    gpu: int
    dense_bytes: int
    dense_params: int
    hot: np.ndarray | None = None
    share: np.ndarray | None = None


def held_format(cfg: ModelConfig, layers: list[LayerCostInputs]) -> str | None:
    """The dense format (memory_model.DENSE_FORMATS) whose held bytes are every layer's dense_bytes, or None
    (inputs not made by the memory model: a test's hand-made layers, or a config that is no checkpoint's)."""
    if not isinstance(cfg, ModelConfig):
        return None
    for fmt in DENSE_FORMATS:
        if layers and all(layer_dense_bytes(cfg, i, fmt) == l.dense_bytes for i, l in enumerate(layers)):
            return fmt
    return None


def shared_expert_part(cfg: ModelConfig, layer: int, dense_format: str) -> tuple[int, int]:
    """(bytes held, multiply-adds per token) of `layer`'s shared expert in `dense_format`: the part of its
    dense weights that runs after the router, beside the routed experts."""
    shared = [s for s in layer_specs(cfg, layer, with_experts=False) if s.role == "shared_expert"]
    params = sum(int(np.prod(s.shape)) for s in shared if len(s.shape) == 2 and not s.is_scale)
    return sum(held_bytes(s, dense_format) for s in shared), params
