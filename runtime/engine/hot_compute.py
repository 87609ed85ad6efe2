"""Device-side expert compute over a pool of packed experts: the hot pool or an upload staging buffer.

Two backends compute the same function:
- `triton`: the generated Triton kernels (MXFP4 dequantized in-kernel); the GPU path, and on a
  CPU-only machine the same kernels under TRITON_INTERPRET=1 (slow: tests use small inputs);
- `torch`: the pool dequantized once to the compute dtype and grouped matmuls; what a plan runs
  on `--device cpu` by default, where the "GPU" is the CPU itself.
Routes are flat arrays: token [R], slot [R] (index into the pool), weight [R] float32.
Legend: R routes, P pool slots, D hidden, I expert intermediate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ostinato.checkpoint.formats import dequantize_mxfp4

from ..kernels.routes import group_flat_routes
from ..kernels.triton_experts import HotPool, decode_experts, prefill_experts
from ..model.experts import swiglu


@dataclass
class DensePool:
    """A pool dequantized for the torch backend: w13 [P, 2I, D] (gate rows, then up), w2 [P, D, I]."""
    w13: torch.Tensor
    w2: torch.Tensor

    @classmethod
    def from_packed(cls, pool: HotPool, n: int, dtype: torch.dtype) -> "DensePool":
        w1 = dequantize_mxfp4(pool.w1[:n], pool.w1_scale[:n], dtype)  # [n, I, D]
        w3 = dequantize_mxfp4(pool.w3[:n], pool.w3_scale[:n], dtype)
        w2 = dequantize_mxfp4(pool.w2[:n], pool.w2_scale[:n], dtype)  # [n, D, I]
        return cls(torch.cat((w1, w3), dim=1), w2)


class TorchPoolCompute:
    name = "torch"

    def __init__(self, limit: float):
        self.limit = limit

    def prefill(self, pool: HotPool, dense: DensePool | None, x: torch.Tensor, token: torch.Tensor,
                slot: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
        """out [T, D] float32 += routes' weighted expert outputs."""
        if token.numel() == 0:
            return
        order = slot.argsort(stable=True)
        token, slot, weight = token[order], slot[order], weight[order]
        counts = torch.bincount(slot, minlength=dense.w13.shape[0]).tolist()
        xs = x[token]  # [R, D]
        start = 0
        for s, c in enumerate(counts):
            if c:
                h = swiglu(xs[start:start + c] @ dense.w13[s].T, self.limit)  # [c, I]
                y = (h @ dense.w2[s].T).float() * weight[start:start + c, None]  # [c, D]
                out.index_add_(0, token[start:start + c], y)
                start += c

    def decode(self, pool: HotPool, dense: DensePool, x: torch.Tensor, slot: torch.Tensor, token: torch.Tensor,
               weight: torch.Tensor, out: torch.Tensor) -> None:
        """Fixed shapes: slot/token/weight [K], slot -1 = padding (contributes nothing)."""
        valid = slot >= 0
        s = slot.clamp(min=0)
        h = swiglu(torch.einsum("kd,kid->ki", x[token], dense.w13[s]), self.limit)  # [K, I]
        y = torch.einsum("ki,kdi->kd", h, dense.w2[s]).float()  # [K, D]
        out.index_add_(0, token, y * (weight * valid)[:, None])


class TritonPoolCompute:
    name = "triton"

    def __init__(self, prefill_module, decode_module):
        self.prefill_mod, self.decode_mod = prefill_module, decode_module

    def prefill(self, pool: HotPool, dense: DensePool | None, x: torch.Tensor, token: torch.Tensor,
                slot: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
        if token.numel() == 0:
            return
        routes = group_flat_routes(token, slot, weight, pool.w1.shape[0])
        prefill_experts(self.prefill_mod, x.float().contiguous(), routes, pool, out)

    def decode(self, pool: HotPool, dense: DensePool | None, x: torch.Tensor, slot: torch.Tensor,
               token: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
        n = self.decode_mod.MAX_ROUTES
        h = torch.empty(n, self.decode_mod.I, dtype=torch.float32, device=x.device)
        decode_experts(self.decode_mod, x.float().contiguous(), slot.int(), token.int(), weight.float(), pool, out, h)
