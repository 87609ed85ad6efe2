"""Run a compiled CPU expert kernel (rendered from templates/cpu/moe_experts.cpp.j2) through ctypes.

Only the built library is needed at run time: no compiler, no jinja2. C ABI (templates/cpu/include/ostinato/c_api.h):
  int ost_moe_experts_f32 (const float* x, int64 T, int64 E, const int64* offsets, const int64* token,
                           const float* weight, const void* const* ptrs /*[E, 6]*/, float* out, int n_threads)
  int ost_moe_experts_bf16(same, x as bf16 bits)
  const char* ost_moe_experts_info(void)
  void ost_cold_task_run(void* task)   /* a decode step's cold routes, see cold_task.py */
  int ost_set_gemm(void* gemm_bf16, void* set_threads_local)   /* the GEMM library, see gemm_library() */
Legend: T = tokens, D = hidden, I = expert intermediate, E = experts in the call.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ostinato.checkpoint.reader import PackedExpert

from .routes import GroupedRoutes

_ERRORS = {-1: "T < 0", -2: "too many experts for this build", -3: "route offsets do not start at 0 or decrease",
           -4: "a route token is out of range", -5: "an expert with routes has a null weight pointer",
           -6: "n_threads < 1"}


def kernel_error(code: int) -> str:
    return _ERRORS.get(code, f"error code {code}")


_FIELDS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


class ExpertTable:
    """Pointers to E experts' packed weights, [E, 6]; keeps the tensors alive. Build once, reuse per call."""

    def __init__(self, experts: list[PackedExpert], D: int, I: int):
        self.tensors = []
        ptrs = (ctypes.c_void_p * (6 * len(experts)))()
        for e, ex in enumerate(experts):
            for j, name in enumerate(_FIELDS):
                t = getattr(ex, name)
                rows, cols = (I, D) if j < 4 else (D, I)
                want = (rows, cols // 2) if j % 2 == 0 else (rows, cols // 32)
                if tuple(t.shape) != want or not t.is_contiguous() or t.element_size() != 1 or t.device.type != "cpu":
                    raise ValueError(f"expert {e} {name}: need a contiguous CPU byte tensor of shape {want}, "
                                     f"got {tuple(t.shape)} {t.dtype} on {t.device}")
                self.tensors.append(t)
                ptrs[6 * e + j] = t.data_ptr()
        self.ptrs = ptrs
        self.n_experts = len(experts)


# MKL's C entry points (by value; the lowercase mkl_set_num_threads_local is the Fortran one, by reference).
_GEMM_SYMBOLS = ("cblas_gemm_bf16bf16f32", "MKL_Set_Num_Threads_Local")


@functools.cache
def gemm_library() -> tuple[int, int] | None:
    """(cblas_gemm_bf16bf16f32, MKL_Set_Num_Threads_Local) addresses from the MKL that torch's CPU wheel links
    statically into libtorch_cpu and exports, or None (torch without MKL, aarch64): the kernel then keeps
    its own tiled path. No link-time dependency, and ctypes calls the kernel without the GIL."""
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        lib = ctypes.CDLL(str(path))
        return tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _GEMM_SYMBOLS)
    except (OSError, AttributeError):
        return None


class CpuExpertKernel:
    """gemm: hand bf16 tiles past the build's gemm_min routes per expert to the GEMM library where it is
    found (gemm_library); False: the kernel's own tiled path (also what a build with gemm_min = 0 does).
    The library is set per loaded library file, so all CpuExpertKernel of one file share the last setting."""

    def __init__(self, library: str | Path, gemm: bool = True):
        self.lib = ctypes.CDLL(str(library))
        self.lib.ost_moe_experts_info.restype = ctypes.c_char_p
        self.info = dict(kv.split("=") for kv in self.lib.ost_moe_experts_info().decode().split())
        self.D, self.I = int(self.info["D"]), int(self.info["I"])
        args = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        for fn in (self.lib.ost_moe_experts_f32, self.lib.ost_moe_experts_bf16):
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.lib.ost_cold_task_run.argtypes, self.lib.ost_cold_task_run.restype = [ctypes.c_void_p], None
        # absent from libraries built from templates before it (a plan's artifact may be one): no library
        self._set_gemm = getattr(self.lib, "ost_set_gemm", None)
        if self._set_gemm:
            self._set_gemm.argtypes, self._set_gemm.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
        self.use_gemm(gemm)

    def use_gemm(self, enabled: bool) -> bool:
        """Set the kernel's GEMM library (enabled and found) or none; True when the build now uses one."""
        fns = gemm_library() if enabled else None
        self.gemm = bool(self._set_gemm and self._set_gemm(*(fns or (None, None))) and fns)
        return self.gemm

    def table(self, experts: list[PackedExpert]) -> ExpertTable:
        return ExpertTable(experts, self.D, self.I)

    def __call__(self, x: torch.Tensor, routes: GroupedRoutes, experts: ExpertTable | list[PackedExpert],
                 out: torch.Tensor, n_threads: int = 1) -> torch.Tensor:
        """out [T, D] float32 += sum over routes of weight * expert(x[token]); x float32 or bfloat16."""
        table = experts if isinstance(experts, ExpertTable) else self.table(experts)
        T = x.shape[0]
        if x.dim() != 2 or x.shape[1] != self.D or x.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"x: need [T, {self.D}] float32 or bfloat16, got {tuple(x.shape)} {x.dtype}")
        if out.shape != (T, self.D) or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"out: need contiguous [{T}, {self.D}] float32, got {tuple(out.shape)} {out.dtype}")
        if routes.n_experts != table.n_experts:
            raise ValueError(f"routes cover {routes.n_experts} experts, the table holds {table.n_experts}")
        x = x.contiguous()
        fn = self.lib.ost_moe_experts_f32 if x.dtype == torch.float32 else self.lib.ost_moe_experts_bf16
        off, tok, wgt = (t.contiguous() for t in (routes.offsets, routes.token, routes.weight))
        rc = fn(x.data_ptr(), T, table.n_experts, off.data_ptr(), tok.data_ptr(), wgt.data_ptr(), table.ptrs,
                out.data_ptr(), n_threads)
        if rc:
            raise ValueError(f"CPU expert kernel rejected its input: {kernel_error(rc)}")
        return out
