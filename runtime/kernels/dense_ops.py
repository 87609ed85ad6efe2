"""Run the plan's row-wise dense-op kernels (templates/cpu/dense_ops.cpp.j2, templates/triton/dense_ops.py.j2).

Registered torch ops, each one dispatch where the reference (runtime/model/norms.py, rope.py) issues
5-10: `torch.ops.ostinato.rms_norm(x, weight, eps, unweighted, kernel)`,
`torch.ops.ostinato.rope(x, cos, sin, inverse, kernel)`; `head_logits(h, w, kernel)` (kernel: the handle
as a tensor, torch_ops.handle_tensor), the LM head for up to 4 tokens from its stored bf16 rows (the
reference widens each block of rows to a float32 copy first, which at one token costs more than the
product; a bf16 plan's bf16 h goes to the vdpbf16ps path where the build has one); and
`fp8_linear(x, q, scale, groups, kernel)`, a checkpoint FP8 matrix as stored times up to 4 tokens on the
host (model/fp8_matrix.py), whose rows `fp8_dequantize_rows` widens a slab at a time for more tokens (a
plain call: no graph traces it). CPU tensors go to the host library (ctypes, which releases the GIL),
CUDA tensors to the Triton kernels; `kernel` is the loaded kernels' handle
(torch_ops.py).
The model reaches them through runtime/model/fused.py while a plan's engine runs a forward; a model
loaded without a plan uses the reference.

Legend: rows of C values (x viewed as [rows, C]), T tokens, R rope channels, R2 = R/2.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from types import ModuleType

import torch

from ostinato.checkpoint.formats import FP8_BLOCK

from .launch import launch
from .torch_ops import define, handle_tensor, loaded, register

_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}  # the host library's dtypes; Triton adds float16
HEAD_MAX_TOKENS = 4  # the host kernel's limit; more tokens take the reference's float32 row blocks
FP8_MAX_TOKENS = 4  # the host FP8 kernel's limit; more tokens dequantize a slab of rows at a time
HEAD_BLOCK = (64, 128)  # Triton: rows per program, columns per step (a 16 KB bf16 tile)

define("rms_norm(Tensor x, Tensor? weight, float eps, bool unweighted, int kernel) -> Tensor",
       lambda x, weight, eps, unweighted, kernel: loaded(kernel).rms_norm_impl(x, weight, eps, unweighted),
       lambda x, weight, eps, unweighted, kernel: torch.empty_like(x))
define("rope(Tensor x, Tensor cos, Tensor sin, bool inverse, int kernel) -> Tensor",
       lambda x, cos, sin, inverse, kernel: loaded(kernel).rope_impl(x, cos, sin, inverse),
       lambda x, cos, sin, inverse, kernel: torch.empty_like(x))
define("head_logits(Tensor h, Tensor w, Tensor kernel) -> Tensor",
       lambda h, w, kernel: loaded(kernel).head_logits_impl(h, w),
       lambda h, w, kernel: h.new_empty(h.shape[0], w.shape[0], dtype=torch.float32))
define("fp8_linear(Tensor x, Tensor q, Tensor scale, int groups, Tensor kernel) -> Tensor",
       lambda x, q, scale, groups, kernel: loaded(kernel).fp8_linear_impl(x, q, scale, groups),
       lambda x, q, scale, groups, kernel: x.new_empty(x.shape[0], x.shape[1], q.shape[0] // groups,
                                                      dtype=torch.float32))


def _block(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


class DenseOpsKernel:
    """A plan's dense-op kernels: the host library (ctypes) and, for GPUs, the Triton module."""

    def __init__(self, library: str | Path, triton_module: ModuleType | None = None, threads: int | None = None):
        self.lib = ctypes.CDLL(str(library))
        p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
        self.lib.ost_rms_norm.argtypes = [p, p, i64, i64, p, f32, i32, i32]
        self.lib.ost_rope.argtypes = [p, p, i64, i64, i64, i64, p, p, i32, i32]
        self.lib.ost_head_logits.argtypes = [p, p, p, i64, i64, i64, i32]
        self.lib.ost_fp8_linear.argtypes = [p, p, p, i64, p, i64, i64, i64, i64, i32]
        self.lib.ost_fp8_dequantize.argtypes = [p, p, i64, p, i64, i64, i64]
        for f in (self.lib.ost_rms_norm, self.lib.ost_rope, self.lib.ost_head_logits, self.lib.ost_fp8_linear,
                  self.lib.ost_fp8_dequantize):
            f.restype = ctypes.c_int
        # bf16 activations go to the vdpbf16ps paths where the build has them (avx512_bf16), else are widened to
        # float32; a library built before a path (a plan compiled earlier) lacks its symbols: the FP8 products'
        # came with the flag, the head's after it
        flag = getattr(self.lib, "ost_fp8_bf16_dot", None)
        self.fp8_bf16_dot = flag is not None and bool(flag())
        if self.fp8_bf16_dot:
            self.lib.ost_fp8_linear_bf16.argtypes = [p, p, p, i64, p, i64, i64, i64, i64, i32]
            self.lib.ost_fp8_linear_bf16.restype = ctypes.c_int
        self.head_bf16_dot = self.fp8_bf16_dot and hasattr(self.lib, "ost_head_logits_bf16")
        if self.head_bf16_dot:
            self.lib.ost_head_logits_bf16.argtypes = [p, p, p, i64, i64, i64, i32]
            self.lib.ost_head_logits_bf16.restype = ctypes.c_int
        # the FP8 dequantizer by output dtype; bf16 rows only from a library built with them (else the caller
        # converts, or keeps float32 slabs)
        self._dequantizers = {torch.float32: self.lib.ost_fp8_dequantize}
        self.dequantizes_bf16 = hasattr(self.lib, "ost_fp8_dequantize_bf16")
        if self.dequantizes_bf16:
            self.lib.ost_fp8_dequantize_bf16.argtypes = [p, p, i64, p, i64, i64, i64]
            self.lib.ost_fp8_dequantize_bf16.restype = ctypes.c_int
            self._dequantizers[torch.bfloat16] = self.lib.ost_fp8_dequantize_bf16
        self.triton = triton_module
        self.threads = threads  # the head's threads on the host; None: torch's intra-op count
        self.handle = register(self)
        self.op_handle = handle_tensor(self.handle)  # for the ops compiled steps call (head, FP8 products)

    def takes(self, x: torch.Tensor) -> bool:
        """Whether the kernels compute x as it is (else the caller runs the reference): contiguous, on
        the CPU in float32 / bf16, or on a GPU with the Triton module in float32 / bf16 / fp16."""
        if not x.is_contiguous() or x.numel() == 0:
            return False
        if x.device.type == "cpu":
            return x.dtype in _DTYPE_CODE
        return self.triton is not None and x.dtype in (torch.float32, torch.bfloat16, torch.float16)

    def takes_head(self, h: torch.Tensor, w: torch.Tensor) -> bool:
        """Whether head_logits computes h [T, D] (float32, or bf16: a bf16 plan's) @ w [V, D] bf16 ^T (else the
        reference's blocks)."""
        return (h.dim() == 2 and 0 < h.shape[0] <= HEAD_MAX_TOKENS and h.dtype in _DTYPE_CODE and h.is_contiguous()
                and w.dtype == torch.bfloat16 and w.is_contiguous() and h.shape[1] == w.shape[1]
                and h.shape[1] % 8 == 0 and h.device == w.device
                and (h.device.type == "cpu" or self.triton is not None))

    def takes_fp8(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, groups: int) -> bool:
        """Whether fp8_linear computes x [G, T, K] (float32, or bf16: a bf16 plan's activations) with q [N, K] e4m3
        on the host (else the caller dequantizes): up to FP8_MAX_TOKENS tokens, K a multiple of 8, G groups of
        whole rows."""
        return (x.dim() == 3 and x.shape[0] == groups and 0 < x.shape[1] <= FP8_MAX_TOKENS and x.dtype in _DTYPE_CODE
                and x.device.type == q.device.type == scale.device.type == "cpu" and q.dim() == 2
                and q.dtype == torch.float8_e4m3fn and q.is_contiguous() and q.shape[1] == x.shape[2]
                and x.shape[2] % 8 == 0 and q.shape[0] % groups == 0 and scale.dim() == 2 and scale.stride(1) == 1
                and scale.element_size() == 1 and scale.shape[0] * FP8_BLOCK >= q.shape[0]
                and scale.shape[1] * FP8_BLOCK >= q.shape[1])

    # ----- the model's entry points (one torch op each) --------------------------------------------
    def head_logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """h [T, D] float32 or bf16 @ w [V, D] bf16 ^T -> [T, V] float32: exact products, float32 sums."""
        return torch.ops.ostinato.head_logits(h, w, self.op_handle)

    def fp8_linear(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, groups: int) -> torch.Tensor:
        """x [G, T, K] float32 or bf16 (contiguous) @ (q, scale) [G*M, K]^T by groups -> [G, T, M] float32."""
        return torch.ops.ostinato.fp8_linear(x, q, scale, groups, self.op_handle)

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
            launch(self.triton.rms_norm_kernel, (rows,), x, y, weight if weight is not None else x, C, eps,
                   HAS_WEIGHT=weight is not None, UNWEIGHTED=unweighted, BLOCK_C=_block(C),
                   num_warps=4 if C <= 4096 else 8)
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
            launch(self.triton.rope_kernel, (rows,), x, y, cos, sin, C, 2 * R2, rows // T, INVERSE=inverse,
                   BLOCK_C=_block(C), BLOCK_R2=_block(R2))
        return y

    def head_logits_impl(self, h, w) -> torch.Tensor:
        T, D = h.shape
        V = w.shape[0]
        out = h.new_empty(T, V, dtype=torch.float32)  # [T, V]
        if h.device.type == "cpu":
            if h.dtype == torch.bfloat16 and self.head_bf16_dot:
                product = self.lib.ost_head_logits_bf16  # bf16 h, vdpbf16ps
            else:
                h, product = h.float(), self.lib.ost_head_logits  # the same values, widened
            rc = product(h.data_ptr(), w.data_ptr(), out.data_ptr(), T, V, D, self.threads or torch.get_num_threads())
            if rc:
                raise ValueError(f"ost_head_logits rejected h {tuple(h.shape)} and a head of {tuple(w.shape)}")
        else:
            bv, bd = HEAD_BLOCK
            launch(self.triton.head_logits_kernel, (-(-V // bv), T), h.float(), w, out, V, D, BV=bv, BD=bd)
        return out

    def fp8_linear_impl(self, x, q, scale, groups) -> torch.Tensor:
        G, T, K = x.shape
        M = q.shape[0] // groups
        out = x.new_empty(G, T, M, dtype=torch.float32)  # [G, T, M]
        x = x.contiguous()
        if x.dtype == torch.bfloat16 and self.fp8_bf16_dot and K % 64 == 0:
            product = self.lib.ost_fp8_linear_bf16  # exact bf16 x, vdpbf16ps
        else:
            x, product = x.float(), self.lib.ost_fp8_linear
        rc = product(x.data_ptr(), q.data_ptr(), scale.data_ptr(), scale.stride(0), out.data_ptr(),
                     G, T, M, K, self.threads or torch.get_num_threads())
        if rc:
            raise ValueError(f"ost_fp8_linear rejected x {tuple(x.shape)} and an FP8 matrix {tuple(q.shape)} "
                             f"with scales {tuple(scale.shape)} in {groups} groups")
        return out

    def fp8_dequantize_rows(self, q: torch.Tensor, scale: torch.Tensor, r0: int, r1: int, out: torch.Tensor) -> bool:
        """Rows r0..r1-1 of (q [N, K] e4m3, scale) into out [r1 - r0, K] (contiguous, float32 or bf16: exact in
        either); False when the host library does not take them (the caller converts with torch)."""
        K = q.shape[1]
        dequantize = self._dequantizers.get(out.dtype)
        if not (dequantize is not None and q.device.type == "cpu" and q.is_contiguous() and K % 8 == 0
                and out.is_contiguous() and out.shape == (r1 - r0, K) and scale.stride(1) == 1):
            return False
        if dequantize(q.data_ptr(), scale.data_ptr(), scale.stride(0), out.data_ptr(), r0, r1, K):
            raise ValueError(f"the FP8 dequantizer rejected rows {r0}:{r1} of an FP8 matrix {tuple(q.shape)}")
        return True
