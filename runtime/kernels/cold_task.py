"""Cold routes inside the fixed-shape decode step: a host task the CUDA graph calls, or the CPU calls.

A decode step knows its routes only on the device. Per layer, a `ColdBridge` owns (pinned, with a
GPU) host buffers for the step's activations and routes, the CPU kernel's result, and a `ColdTask`
struct pointing at them and at the layer's cold expert table. The step copies x and the routes into
those buffers, runs the generated `ost_cold_task_run(task)` (templates/cpu/moe_experts.cpp.j2) and
copies the result back:
- the three stages go on a side stream forked from the current one (start) and joined back before
  the add (finish), through engine/streams.py;
- on a GPU the middle one is a host function (cuLaunchHostFunc), so a CUDA graph captures the
  stages as memcpy / host / memcpy nodes and the hot experts run on the main stream meanwhile;
- on the CPU the same buffers, streams calls and C function are used, the function called
  directly when its turn comes (the twin, whose stream log tests check).
A host node cannot report an error, so the task leaves a status code that `check()` reads after
the step.
Legend: D hidden, k routes per token, E experts of the model.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from ..engine.streams import streams_for
from .cpu_experts import CpuExpertKernel, ExpertTable, kernel_error

HOST_FN_ERRORS = {-7: "an expert id is out of range", -8: "cold_of points past the cold table"}


class ColdTask(ctypes.Structure):
    """Mirror of `struct ColdTask` in the CPU kernel template (field order and types must match)."""
    _fields_ = [("x", ctypes.c_void_p), ("x_bf16", ctypes.c_int64), ("T", ctypes.c_int64), ("k", ctypes.c_int64),
                ("expert_ids", ctypes.c_void_p), ("weights", ctypes.c_void_p), ("cold_of", ctypes.c_void_p),
                ("n_model_experts", ctypes.c_int64), ("n_cold", ctypes.c_int64), ("ptrs", ctypes.c_void_p),
                ("out", ctypes.c_void_p), ("n_threads", ctypes.c_int64), ("status", ctypes.c_int64)]


@functools.cache
def _libcuda():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"cold routes in a CUDA decode step need the CUDA driver library: {e}") from e
    lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cuLaunchHostFunc.restype = ctypes.c_int
    return lib


class ColdBridge:
    """One layer's cold routes in the decode step (T = 1 token, k routes)."""

    def __init__(self, kernel: CpuExpertKernel, table: ExpertTable, cold_of: torch.Tensor, k: int,
                 x_dtype: torch.dtype, device: torch.device, n_threads: int):
        self.kernel, self.table, self.device = kernel, table, torch.device(device)
        cuda = self.device.type == "cuda"

        def host(shape, dtype):  # pinned with a GPU: the copies are then true async DMA
            t = torch.zeros(shape, dtype=dtype)
            return t.pin_memory() if cuda else t

        host_dtype = torch.float32 if x_dtype == torch.float32 else torch.bfloat16
        self.x = host((1, kernel.D), host_dtype)           # [1, D]
        self.ids = host((1, k), torch.int64)               # [1, k]
        self.weights = host((1, k), torch.float32)         # [1, k]
        self.out = host((1, kernel.D), torch.float32)      # [1, D]
        self.cold_of = cold_of.to("cpu", torch.int64).contiguous()  # [E]
        self.task = ColdTask(self.x.data_ptr(), int(host_dtype == torch.bfloat16), 1, k, self.ids.data_ptr(),
                             self.weights.data_ptr(), self.cold_of.data_ptr(), self.cold_of.numel(), table.n_experts,
                             ctypes.cast(table.ptrs, ctypes.c_void_p), self.out.data_ptr(), n_threads, 0)
        self.fn = ctypes.cast(kernel.lib.ost_cold_task_run, ctypes.c_void_p)
        self.out_device = torch.zeros(1, kernel.D, device=self.device)  # [1, D] float32
        self.streams = streams_for(self.device)
        self.side = self.streams.new(self.device)  # made here: a capture cannot make streams
        self.libcuda = _libcuda() if cuda else None

    def start(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> None:
        """Begin the cold routes of x [1, D] with expert_ids / weights [1, k] (capturable on a GPU)."""
        s = self.streams
        s.wait_stream(self.side, s.current(self.device))  # fork: x and the routes are ready
        with s.on(self.side):
            self._stage(x, expert_ids, weights)
            self._run_task()
            self.out_device.copy_(self.out, non_blocking=True)

    def finish(self) -> torch.Tensor:
        """The cold routes' sum [1, D] float32 on the layer's device, ordered after start()'s work."""
        self.streams.wait_stream(self.streams.current(self.device), self.side)  # join
        return self.out_device

    def check(self) -> None:
        """Raise if the last host task rejected its input (host side, after the step)."""
        status = self.task.status
        if status:
            raise ValueError(f"cold expert task failed: {HOST_FN_ERRORS.get(status) or kernel_error(status)}")

    def _stage(self, x, expert_ids, weights) -> None:
        self.x.copy_(x.reshape(1, -1), non_blocking=True)
        self.ids.copy_(expert_ids.reshape(1, -1), non_blocking=True)
        self.weights.copy_(weights.reshape(1, -1), non_blocking=True)

    def _run_task(self) -> None:
        """The CPU kernel over the staged buffers: a host function on the side stream with a GPU, a call
        now on the CPU (where the copies before it are already done)."""
        if self.libcuda is None:
            self.kernel.lib.ost_cold_task_run(ctypes.byref(self.task))
            return
        rc = self.libcuda.cuLaunchHostFunc(ctypes.c_void_p(self.side.cuda_stream), self.fn,
                                          ctypes.c_void_p(ctypes.addressof(self.task)))
        if rc != 0:
            raise RuntimeError(f"cuLaunchHostFunc failed with CUresult {rc}")
