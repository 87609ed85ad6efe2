"""Run the plan's mHC mixing kernels (templates/cpu/hc_mix.cpp.j2, templates/triton/hc_mix.py.j2).

One torch op, `torch.ops.ostinato.hc_mix(mix, base, scale, kernel) -> (pre, post, comb)`, replaces the ~140 ops of the
reference's mixing (runtime/model/hyper_connection.py, mix_weights: sigmoids, a softmax and ~20
Sinkhorn iterations on [T, N, N]), registered in the `ostinato` op namespace (torch_ops.py): CPU
tensors go to the host library through ctypes (which releases the GIL), CUDA tensors to the Triton
kernel. `kernel` is the handle of the loaded kernels (each bakes in its model's N, iterations and eps).

Legend: T tokens, N hc_mult streams, M = (2 + N) N mixing logits.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import ModuleType

import torch

from .launch import launch
from .torch_ops import define, loaded, register


def _hc_mix(mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, kernel: int):
    """mix [T, M] float32 (contiguous), base [M], scale [3] -> (pre [T, N], post [T, N], comb [T, N, N]):
    views of one [T, M] result, made inside the op so that the caller dispatches once."""
    k = loaded(kernel)
    out = k.compute(mix, base, scale)
    return out[:, :k.n], out[:, k.n:2 * k.n], out[:, 2 * k.n:].view(-1, k.n, k.n)


def _hc_mix_meta(mix, base, scale, kernel):
    n = round((mix.shape[1] + 1) ** 0.5) - 1  # N from M = (2 + N) N
    return mix.new_empty(mix.shape[0], n), mix.new_empty(mix.shape[0], n), mix.new_empty(mix.shape[0], n, n)


define("hc_mix(Tensor mix, Tensor base, Tensor scale, int kernel) -> (Tensor, Tensor, Tensor)", _hc_mix, _hc_mix_meta)


class HcMixKernel:
    """A model's mixing kernels: the host library (ctypes) and, for GPUs, the Triton module."""

    def __init__(self, library: str | Path, triton_module: ModuleType | None = None):
        self.lib = ctypes.CDLL(str(library))
        self.lib.ost_hc_mix.restype = ctypes.c_int
        self.lib.ost_hc_mix.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p]
        self.lib.ost_hc_mix_info.restype = ctypes.c_char_p
        info = dict(f.split("=") for f in self.lib.ost_hc_mix_info().decode().split())
        self.n, self.iters, self.eps = int(info["N"]), int(info["ITERS"]), float(info["EPS"])
        self.triton = triton_module
        if triton_module is not None and (triton_module.N, triton_module.ITERS) != (self.n, self.iters):
            raise ValueError(f"hc_mix kernels disagree: host N={self.n} ITERS={self.iters}, Triton "
                             f"N={triton_module.N} ITERS={triton_module.ITERS}")
        self.handle = register(self)

    def matches(self, n: int, iters: int, eps: float) -> bool:
        return (self.n, self.iters) == (n, iters) and self.eps == eps

    def __call__(self, mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """mix [T, M] float32 -> (pre [T, N], post [T, N], comb [T, N, N]), views of one [T, M] result."""
        return torch.ops.ostinato.hc_mix(mix, base, scale, self.handle)

    def compute(self, mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        n = self.n
        M = (2 + n) * n
        for name, t, shape in (("mix", mix, (mix.shape[0], M)), ("base", base, (M,)), ("scale", scale, (3,))):
            if tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous() or t.device != mix.device:
                raise ValueError(f"hc_mix: {name} must be a contiguous float32 tensor of shape {shape} on "
                                 f"{mix.device}, got {tuple(t.shape)} {t.dtype} on {t.device}")
        out = torch.empty_like(mix)
        if mix.device.type == "cpu":
            code = self.lib.ost_hc_mix(mix.data_ptr(), mix.shape[0], base.data_ptr(), scale.data_ptr(), out.data_ptr())
            if code != 0:
                raise RuntimeError(f"ost_hc_mix failed with code {code}")
        elif self.triton is None:
            raise RuntimeError(f"hc_mix on {mix.device}: no Triton kernel was loaded")
        elif mix.shape[0]:
            launch(self.triton.hc_mix_kernel, (mix.shape[0],), mix, base, scale, out)
        return out
