"""KTransformers-like (kt-kernel + its SGLang fork, as docs/baselines.md summarises its docs): attention, the
shared expert and the dense parts on the GPU, every routed expert on the CPU (`--kt-num-gpu-experts`
0 here; N > 0 keeps N chosen experts per layer on the GPU); prefills above
`--kt-gpu-prefill-token-threshold` switch to layerwise GPU prefill, streaming the whole layer's experts
to one GPU buffer (modeled double-buffered like every upload here). Decode: routed experts on the CPU.
Like Ostinato it runs PyTorch: prefill eagerly (op dispatch counted at an unfused PyTorch forward's
UNFUSED_EAGER_OPS_PER_LAYER), decode as captured CUDA graphs.
Not modeled: expert deferral (an approximation Ostinato does not make)."""

from __future__ import annotations

import numpy as np

from ..cost_model import UNFUSED_EAGER_OPS_PER_LAYER, CostModel
from .policy import Forward, Policy, split_pass, static_decode, upload_pass


class KTransformers(Policy):
    name = "KTransformers-like"

    def __init__(self, cost: CostModel, threshold: int, gpu_experts: np.ndarray | None = None):
        super().__init__(cost.with_eager_ops(UNFUSED_EAGER_OPS_PER_LAYER))  # its forward is not ours
        E = cost.layers[0].hot.size
        self.threshold = threshold
        self.gpu = gpu_experts if gpu_experts is not None else np.zeros((self.L, E), dtype=bool)

    def prefill(self, counts: np.ndarray, n: int) -> Forward:
        if n > self.threshold:
            return upload_pass(self.cost, counts, n, np.broadcast_to(~self.gpu, counts.shape), "layerwise")
        return split_pass(self.cost, counts, n, self.gpu, "cpu")

    def decode(self, ids: np.ndarray) -> tuple[np.ndarray, Forward]:
        return static_decode(self.cost, self.gpu, ids)
