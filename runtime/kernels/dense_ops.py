"""Run the plan's row-wise dense-op kernels (templates/cpu/dense_ops.cpp.j2, templates/triton/dense_ops.py.j2).

Two registered torch ops, each one dispatch where the reference (runtime/model/norms.py, rope.py)
issues 5-10: `torch.ops.ostinato.rms_norm(x, weight, eps, unweighted, kernel)` and
`torch.ops.ostinato.rope(x, cos, sin, inverse, kernel)`. CPU tensors go to the host library (ctypes,
which releases the GIL), CUDA tensors to the Triton kernels; `kernel` indexes the loaded kernels.
The model reaches them through runtime/model/fused.py while a plan's engine runs a forward; a model
loaded without a plan uses the reference.

Legend: rows of C values (x viewed as [rows, C]), T tokens, R rope channels, R2 = R/2.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import ModuleType

import torch

_LOADED: list["DenseOpsKernel"] = []
_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}  # the host library's dtypes; Triton adds float16

_LIB = torch.library.Library("ostinato", "FRAGMENT")  # the namespace's ops live in several modules
_LIB.define("rms_norm(Tensor x, Tensor? weight, float eps, bool unweighted, int kernel) -> Tensor")
_LIB.define("rope(Tensor x, Tensor cos, Tensor sin, bool inverse, int kernel) -> Tensor")


def _rms_norm(x, weight, eps, unweighted, kernel):
    return _LOADED[kernel].rms_norm_impl(x, weight, eps, unweighted)


def _rope(x, cos, sin, inverse, kernel):
    return _LOADED[kernel].rope_impl(x, cos, sin, inverse)


for _key in ("CPU", "CUDA"):
    _LIB.impl("rms_norm", _rms_norm, _key)
    _LIB.impl("rope", _rope, _key)
_LIB.impl("rms_norm", lambda x, weight, eps, unweighted, kernel: torch.empty_like(x), "Meta")
_LIB.impl("rope", lambda x, cos, sin, inverse, kernel: torch.empty_like(x), "Meta")


def _block(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


class DenseOpsKernel:
    """A plan's dense-op kernels: the host library (ctypes) and, for GPUs, the Triton module."""

    def __init__(self, library: str | Path, triton_module: ModuleType | None = None):
        self.lib = ctypes.CDLL(str(library))
        p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
        self.lib.ost_rms_norm.argtypes = [p, p, i64, i64, p, f32, i32, i32]
        self.lib.ost_rope.argtypes = [p, p, i64, i64, i64, i64, p, p, i32, i32]
        self.lib.ost_rms_norm.restype = self.lib.ost_rope.restype = ctypes.c_int
        self.triton = triton_module
        self.handle = len(_LOADED)
        _LOADED.append(self)

    def takes(self, x: torch.Tensor) -> bool:
        """Whether the kernels compute x as it is (else the caller runs the reference): contiguous, on
        the CPU in float32 / bf16, or on a GPU with the Triton module in float32 / bf16 / fp16."""
        if not x.is_contiguous() or x.numel() == 0:
            return False
        if x.device.type == "cpu":
            return x.dtype in _DTYPE_CODE
        return self.triton is not None and x.dtype in (torch.float32, torch.bfloat16, torch.float16)

    # ----- the model's entry points (one torch op each) --------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        return torch.ops.ostinato.rms_norm(x, weight, eps, False, self.handle)

    def unweighted_rms_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        return torch.ops.ostinato.rms_norm(x, None, eps, True, self.handle)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> torch.Tensor:
        return torch.ops.ostinato.rope(x, cos, sin, inverse, self.handle)

    # ----- the ops' implementations -------------------------------------------------------------
    def rms_norm_impl(self, x, weight, eps, unweighted) -> torch.Tensor:
        C = x.shape[-1]
        rows = x.numel() // C
        if weight is not None and (weight.shape != (C,) or weight.dtype != torch.float32 or not weight.is_contiguous()):
            raise ValueError(f"rms_norm: weight must be a contiguous float32 [{C}], got {tuple(weight.shape)} "
                             f"{weight.dtype}")
        y = torch.empty_like(x)
        if x.device.type == "cpu":
            rc = self.lib.ost_rms_norm(x.data_ptr(), y.data_ptr(), rows, C, weight.data_ptr() if weight is not None
                                       else None, eps, int(unweighted), _DTYPE_CODE[x.dtype])
            if rc:
                raise ValueError(f"ost_rms_norm rejected x of shape {tuple(x.shape)} {x.dtype}")
        else:
            self.triton.rms_norm_kernel[(rows,)](x, y, weight if weight is not None else x, C, eps,
                                                 HAS_WEIGHT=weight is not None, UNWEIGHTED=unweighted,
                                                 BLOCK_C=_block(C), num_warps=4 if C <= 4096 else 8)
        return y

    def rope_impl(self, x, cos, sin, inverse) -> torch.Tensor:
        C, T, R2 = x.shape[-1], x.shape[0], cos.shape[-1]
        rows = x.numel() // C
        for name, t in (("cos", cos), ("sin", sin)):
            if t.shape != (T, R2) or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"rope: {name} must be a contiguous float32 [{T}, {R2}], got {tuple(t.shape)} "
                                 f"{t.dtype}")
        y = torch.empty_like(x)
        if x.device.type == "cpu":
            rc = self.lib.ost_rope(x.data_ptr(), y.data_ptr(), rows, C, 2 * R2, rows // T, cos.data_ptr(),
                                   sin.data_ptr(), int(inverse), _DTYPE_CODE[x.dtype])
            if rc:
                raise ValueError(f"ost_rope rejected x of shape {tuple(x.shape)} with {2 * R2} rope channels")
        else:
            self.triton.rope_kernel[(rows,)](x, y, cos, sin, C, 2 * R2, rows // T, INVERSE=inverse,
                                             BLOCK_C=_block(C), BLOCK_R2=_block(R2))
        return y
