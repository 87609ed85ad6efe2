"""RMS norms as DeepSeek-V4 uses them: float32 math, optional float32 weight, cast back once.

Legend: ... any leading dims, C normalized channels.
"""

from __future__ import annotations

import torch

from .fused import active, inductor_generates


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [..., C] -> [..., C] in x's dtype; weight (float32) multiplies in float32 before the cast.
    One generated kernel when a plan's forward runs (fused.py), else this reference."""
    kernels = active()
    if kernels is not None and kernels.takes(x) and not inductor_generates():
        return kernels.rms_norm(x, weight, eps)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = weight * y
    return y.to(x.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' UnweightedRMSNorm: the float32 inverse rms is cast to x's dtype, then multiplies x."""
    kernels = active()
    if kernels is not None and kernels.takes(x) and not inductor_generates():
        return kernels.unweighted_rms_norm(x, eps)
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)
