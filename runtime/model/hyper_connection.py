"""Manifold-constrained hyper-connections (mHC): the residual is N parallel streams (docs/model.md section 3).

Before each sublayer, `hc_pre` mixes the streams into the sublayer input and yields the `post` and
`comb` weights; after it, `hc_post` writes the output back: X'_k = post_k * y + sum_j comb[j, k] X_j.
comb is made doubly stochastic by Sinkhorn iterations (not symmetric: the direction matters).
The residual streams stay float32 whatever the compute dtype: they are small (N x D per token) and
every mixing weight is float32 anyway.

Legend: T tokens, N hc_mult streams, D hidden, M = (2 + N) * N mixing logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .fp8_matrix import linear
from .fused import inductor_generates
from .norms import unweighted_rms_norm


@dataclass(frozen=True)
class HcWeights:
    fn: torch.Tensor     # [M, N*D] float32
    base: torch.Tensor   # [M] float32
    scale: torch.Tensor  # [3] float32 (pre, post, comb)


@dataclass(frozen=True)
class HcHeadWeights:
    fn: torch.Tensor     # [N, N*D] float32
    base: torch.Tensor   # [N]
    scale: torch.Tensor  # [1]


def mix_weights(mix: torch.Tensor, w: HcWeights, n: int, n_iters: int, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference mixing: logits mix [T, M] -> (pre [T, N], post [T, N], comb [T, N, N]), comb made
    doubly stochastic by Sinkhorn. The plan's hc_mix kernels (runtime/kernels/hc_mix.py) compute the
    same in one op; this is their reference and the path of models loaded without a plan."""
    t = mix.shape[0]
    pre_w, post_w, comb_w = mix.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = w.base.split([n, n, n * n])
    pre = torch.sigmoid(pre_w * w.scale[0] + pre_b) + eps  # [T, N]
    post = 2 * torch.sigmoid(post_w * w.scale[1] + post_b)  # [T, N]
    comb = torch.softmax(comb_w.view(t, n, n) * w.scale[2] + comb_b.view(n, n), dim=-1) + eps  # [T, N, N]
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(n_iters - 1):  # in place: same values, a third fewer dispatches
        comb /= comb.sum(dim=-1, keepdim=True).add_(eps)
        comb /= comb.sum(dim=-2, keepdim=True).add_(eps)
    return pre, post, comb


def hc_pre(x: torch.Tensor, w: HcWeights, n_iters: int, eps: float, norm_eps: float, dtype: torch.dtype,
           mix_kernel: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, N, D] float32 -> (sublayer input [T, D] in dtype, post [T, N], comb [T, N, N]).
    `mix_kernel`: the plan's HcMixKernel (one op), else the reference mix_weights."""
    t, n, _ = x.shape
    mix = linear(unweighted_rms_norm(x.reshape(t, -1), norm_eps), w.fn)  # [T, M]
    if mix_kernel is not None and not inductor_generates():  # compiled steps: Inductor fuses the reference
        pre, post, comb = mix_kernel(mix, w.base, w.scale)
    else:
        pre, post, comb = mix_weights(mix, w, n, n_iters, eps)
    collapsed = (pre.unsqueeze(-1) * x).sum(dim=1)  # [T, D]
    return collapsed.to(dtype), post, comb


def hc_post(x: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Residual x [T, N, D], sublayer output y [T, D] -> new residual [T, N, D] (float32)."""
    # X'_k = post_k y + sum_j comb[j, k] X_j, the matmul accumulated onto the first term in one op
    return torch.baddbmm(post.unsqueeze(-1) * y.float().unsqueeze(-2), comb.transpose(-1, -2), x)  # [T, N, D]


def hc_head(x: torch.Tensor, w: HcHeadWeights, eps: float, norm_eps: float) -> torch.Tensor:
    """Final collapse of the streams: x [T, N, D] -> [T, D] float32."""
    mix = linear(unweighted_rms_norm(x.flatten(1), norm_eps), w.fn)  # [T, N]
    pre = torch.sigmoid(mix * w.scale + w.base) + eps  # [T, N]
    return (pre.unsqueeze(-1) * x).sum(dim=1)  # [T, D]
