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

from ostinato.compiler.cost_model import UNFUSED_EAGER_OPS_PER_LAYER, CostModel

from .policy import Forward, Policy, split_pass, static_decode, upload_pass


def frequency_placed(shares: np.ndarray, per_layer: int) -> np.ndarray:
    """[L, E] bool: each layer's `per_layer` most-routed experts by the profile's shares [L, E] (what
    `--kt-num-gpu-experts N` keeps on the GPU: N per layer, chosen by activation frequency; ties to the
    lower id)."""
    L, E = shares.shape
    top = np.argsort(-shares, axis=1, kind="stable")[:, :min(per_layer, E)]  # [L, N]
    gpu = np.zeros((L, E), dtype=bool)
    gpu[np.arange(L)[:, None], top] = True
    return gpu


class KTransformers(Policy):
    name = "KTransformers-like"

    def __init__(self, cost: CostModel, threshold: int, gpu_experts: np.ndarray | None = None, kernel=None):
        """`gpu_experts` [L, E] bool: the experts it keeps on the GPUs (frequency_placed; None: none);
        `kernel`: kt-kernel's slowdown against Ostinato's CPU kernel (kernels.py; None: the same speed)."""
        cost = cost.with_eager_ops(UNFUSED_EAGER_OPS_PER_LAYER)  # its forward is not ours
        super().__init__(cost.with_host_kernel(kernel) if kernel is not None else cost)
        if gpu_experts is not None:
            self.name = "KTransformers-like + GPU experts"
        E = cost.layers[0].hot.size
        self.threshold = threshold
        self.gpu = gpu_experts if gpu_experts is not None else np.zeros((self.L, E), dtype=bool)

    def prefill(self, counts: np.ndarray, n: int) -> Forward:
        if n > self.threshold:
            return upload_pass(self.cost, counts, n, np.broadcast_to(~self.gpu, counts.shape), "layerwise")
        return split_pass(self.cost, counts, n, self.gpu, "cpu")

    def decode(self, ids: np.ndarray) -> tuple[np.ndarray, Forward]:
        return static_decode(self.cost, self.gpu, ids)
