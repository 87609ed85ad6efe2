"""Routed-expert execution: the executor contract and the plain executor that computes every route.

The MoE block hands an executor the routes of one layer; where and how they run (GPU-resident hot
experts, CPU cold experts, uploads) is the executor's business, so placement never touches the model.

    executor(layer, x [T, D] compute dtype, expert_ids [T, k] int64, weights [T, k] float32) -> [T, D]
    = sum over k of weights * expert(x), shared expert excluded (the MoE block adds it).

Expert e: h = silu(min(x W1^T, limit)) * clamp(x W3^T, -limit, limit); out = h W2^T.

Legend: T tokens, k experts per token, R = T*k routes, D hidden, I moe_intermediate_size, E experts.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from ostinato.checkpoint.formats import dequantize_mxfp4
from ostinato.checkpoint.tensor_specs import layer_prefix


class ExpertExecutor(Protocol):
    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        ...


def swiglu(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """[R, 2I] (gate | up) -> [R, I], with DeepSeek-V4's clamps."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


class DenseExpertExecutor:
    """Every routed expert dequantized to the compute dtype, routes grouped by expert.

    Routes are sorted by expert once; each expert with routes runs two matmuls over its contiguous
    slice (no per-token Python loop). Holds all experts' weights: meant for tests, CPU runs and as
    the reference the placement executors are checked against.
    """

    def __init__(self, w13: list[torch.Tensor], w2: list[torch.Tensor], limit: float):
        self.w13 = w13  # per layer [E, 2I, D]: gate rows then up rows
        self.w2 = w2    # per layer [E, D, I]
        self.limit = limit

    @classmethod
    def from_checkpoint(cls, ckpt, dtype: torch.dtype, device: torch.device | str, claims=None, mtp: bool = False
                        ) -> DenseExpertExecutor:
        """`mtp`: the MTP blocks' experts too (their layer indices follow the main layers')."""
        cfg = ckpt.config
        w13, w2 = [], []
        for layer in ckpt.expert_layers if mtp else range(cfg.num_hidden_layers):
            w = {}
            for name in ("w1", "w3", "w2"):
                # Stack the packed bytes of all experts first: one vectorized decode per layer and matrix.
                names = [f"{layer_prefix(cfg, layer)}.ffn.experts.{e}.{name}" for e in range(cfg.n_routed_experts)]
                packed = torch.stack([ckpt.raw(f"{n}.weight") for n in names])  # [E, N, K/2] int8
                scales = torch.stack([ckpt.raw(f"{n}.scale") for n in names])  # [E, N, K/32] e8m0
                w[name] = dequantize_mxfp4(packed, scales, dtype).to(device)  # [E, N, K]
                if claims is not None:
                    claims.claim(*(f"{n}.weight" for n in names))
            w13.append(torch.cat((w["w1"], w["w3"]), dim=1))  # [E, 2I, D]
            w2.append(w["w2"])  # [E, D, I]
        return cls(w13, w2, cfg.swiglu_limit)

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        t, k = expert_ids.shape
        flat = expert_ids.reshape(-1)  # [R]
        order = flat.argsort(stable=True)  # routes grouped by expert
        counts = torch.bincount(flat, minlength=self.w13[layer].shape[0]).tolist()
        xs = x[order // k]  # [R, D] each route's token
        out = torch.empty(t * k, x.shape[1], dtype=torch.float32, device=x.device)  # [R, D] sorted order
        start = 0
        for e, c in enumerate(counts):
            if c:
                h = swiglu(xs[start:start + c] @ self.w13[layer][e].T, self.limit)  # [c, I]
                out[start:start + c] = h @ self.w2[layer][e].T  # [c, D]
                start += c
        routed = torch.empty_like(out)
        routed[order] = out * weights.reshape(-1)[order, None]  # back to route order [T*k, D]
        return routed.view(t, k, -1).sum(dim=1).to(x.dtype)  # [T, D]
