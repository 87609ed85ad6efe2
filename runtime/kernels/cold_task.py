"""Cold routes inside the fixed-shape decode step: a host task the CUDA graph calls, or the CPU calls.

A fixed-shape step (decode: T = 1; a short-prefill bucket: T tokens) knows its routes only on the
device. Per layer, a `ColdBridge` owns one `ColdTask` struct per token count, pointing at host
buffers (pinned, with a GPU) for the step's activations and routes and the CPU kernel's result (a
`ColdStaging`, shared by one device's layers) and at the layer's cold expert table. The step
copies x and the routes into those buffers, runs the generated `ost_cold_task_run(task)`
(templates/cpu/moe_experts.cpp.j2) and copies the result back:
- the three stages go on a side stream forked from the current one (start) and joined back before
  the add (finish), through engine/streams.py;
- on a GPU the middle one is a host function (cuLaunchHostFunc), so a CUDA graph captures the
  stages as memcpy / host / memcpy nodes and the hot experts run on the main stream meanwhile;
- on the CPU the same buffers, streams calls and C function are used, the function called
  directly when its turn comes (the twin, whose stream log tests check).
A host node cannot report an error, so the task leaves a status code that `check()` reads after
the step.
Legend: T tokens of the step, D hidden, k routes per token, E experts of the model.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

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


def run_on_host(kernel: CpuExpertKernel, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
                row_of: torch.Tensor, table: ExpertTable, out: torch.Tensor, n_threads: int, what: str) -> None:
    """The kernel's task, called now on host tensors in place: x [T, D] float32/bf16, expert_ids [T, k] int64
    and weights [T, k] float32 (contiguous), row_of [E] int64 (an expert's row in `table`, or -1: skipped),
    out [T, D] float32 overwritten with the routes' sum. Raises naming `what` if the task rejects its input."""
    T = x.shape[0]
    task = ColdTask(x.data_ptr(), int(x.dtype == torch.bfloat16), T, expert_ids.shape[1], expert_ids.data_ptr(),
                    weights.data_ptr(), row_of.data_ptr(), row_of.numel(), table.n_experts,
                    ctypes.cast(table.ptrs, ctypes.c_void_p), out.data_ptr(), n_threads, 0)
    kernel.lib.ost_cold_task_run(ctypes.byref(task))
    if task.status:
        raise ValueError(f"{what} failed: {HOST_FN_ERRORS.get(task.status) or kernel_error(task.status)}")


@functools.cache
def _libcuda():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"cold routes in a CUDA decode step need the CUDA driver library: {e}") from e
    lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cuLaunchHostFunc.restype = ctypes.c_int
    return lib


class ColdStaging:
    """Host buffers for up to `max_tokens` tokens' cold routes, shared by the bridges of one device's
    layers: a step's layers run one after another (each bridge's finish() joins its side stream before
    the next layer's start()), so one set serves them all."""

    def __init__(self, D: int, k: int, token_counts: list[int], x_dtype: torch.dtype, device: torch.device):
        """`token_counts`: the steps' T (their row views are made now, so every step issues the same ops)."""
        self.device, self.max_tokens = torch.device(device), max(token_counts)
        max_tokens = self.max_tokens
        cuda = self.device.type == "cuda"

        def host(shape, dtype):  # pinned with a GPU: the copies are then true async DMA
            t = torch.zeros(shape, dtype=dtype)
            return t.pin_memory() if cuda else t

        self.x_dtype = torch.float32 if x_dtype == torch.float32 else torch.bfloat16
        self.x = host((max_tokens, D), self.x_dtype)            # [Tmax, D]
        self.ids = host((max_tokens, k), torch.int64)           # [Tmax, k]
        self.weights = host((max_tokens, k), torch.float32)     # [Tmax, k]
        self.out = host((max_tokens, D), torch.float32)         # [Tmax, D]
        self.out_device = torch.zeros(max_tokens, D, device=self.device)  # [Tmax, D] float32
        self._rows: dict[int, tuple] = {}
        self.token_counts = sorted(set(token_counts))
        for T in self.token_counts:
            self.rows(T)

    def rows(self, T: int) -> tuple[torch.Tensor, ...]:
        """Views of the first T rows (x, ids, weights, out, out_device), made once per T: slicing on every
        step would cost five dispatches per layer."""
        if T not in self._rows:
            self._rows[T] = tuple(t[:T] for t in (self.x, self.ids, self.weights, self.out, self.out_device))
        return self._rows[T]

    @property
    def nbytes(self) -> tuple[int, int]:
        """(host bytes, device bytes) these buffers hold."""
        host = sum(t.numel() * t.element_size() for t in (self.x, self.ids, self.weights, self.out))
        return host, self.out_device.numel() * 4


class ColdBridge:
    """One layer's cold routes in a fixed-shape step of T tokens (T <= the staging's max_tokens), k routes each."""

    def __init__(self, kernel: CpuExpertKernel, table: ExpertTable, cold_of: torch.Tensor, staging: ColdStaging,
                 n_threads: int | Callable[[int], int]):
        """`n_threads`: the kernel's threads, or a function of a step's T giving them (the executor's pool_threads:
        decode-sized steps run fewer than prefill buckets); fixed per T in the task struct a graph captures."""
        self.kernel, self.table, self.staging = kernel, table, staging
        self.threads_of = n_threads if callable(n_threads) else lambda T: n_threads
        self.device = staging.device
        self.cold_of = cold_of.to("cpu", torch.int64).contiguous()  # [E]
        self.tasks: dict[int, ColdTask] = {}  # T -> its task struct (a captured host node keeps its address)
        self.fn = ctypes.cast(kernel.lib.ost_cold_task_run, ctypes.c_void_p)
        self.streams = streams_for(self.device)
        # the device's one cold stream, shared by its layers (each layer joins it before the next forks it);
        # made now: a capture cannot make streams
        self.side = self.streams.named(self.device, "cold")
        self.libcuda = _libcuda() if self.device.type == "cuda" else None
        for T in staging.token_counts:
            self.task(T)

    def task(self, T: int) -> ColdTask:
        """The task over the staging's first T rows (made once per T, then kept: its address is captured)."""
        if T not in self.tasks:
            st = self.staging
            if not 1 <= T <= st.max_tokens:
                raise ValueError(f"a cold bridge stages 1..{st.max_tokens} tokens, not {T}")
            self.tasks[T] = ColdTask(st.x.data_ptr(), int(st.x_dtype == torch.bfloat16), T, st.ids.shape[1],
                                     st.ids.data_ptr(), st.weights.data_ptr(), self.cold_of.data_ptr(),
                                     self.cold_of.numel(), self.table.n_experts,
                                     ctypes.cast(self.table.ptrs, ctypes.c_void_p), st.out.data_ptr(),
                                     self.threads_of(T), 0)
        return self.tasks[T]

    def start(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> None:
        """Begin the cold routes of x [T, D] with expert_ids / weights [T, k] (capturable on a GPU)."""
        T, s = x.shape[0], self.streams
        task = self.task(T)
        x_rows, ids, w, out, out_device = self.staging.rows(T)
        s.wait_stream(self.side, s.current(self.device))  # fork: x and the routes are ready
        with s.on(self.side):
            x_rows.copy_(x, non_blocking=True)
            ids.copy_(expert_ids.view(T, -1), non_blocking=True)
            w.copy_(weights.view(T, -1), non_blocking=True)
            self._run_task(task)
            out_device.copy_(out, non_blocking=True)

    def finish(self, T: int = 1) -> torch.Tensor:
        """The cold routes' sums [T, D] float32 on the layer's device, ordered after start()'s work."""
        self.streams.wait_stream(self.streams.current(self.device), self.side)  # join
        return self.staging.rows(T)[4]

    def check(self) -> None:
        """Raise if a host task rejected its input (host side, after the step). Every task's status is read
        and cleared, so a failure is reported once, by the step it happened in, and not again by every
        later step (a step of another T does not run, so does not overwrite, that task's status)."""
        failed = {T: task.status for T, task in self.tasks.items() if task.status}
        for task in self.tasks.values():
            task.status = 0
        if failed:
            raise ValueError("cold expert task failed: " + "; ".join(
                f"{T}-token step: {HOST_FN_ERRORS.get(code) or kernel_error(code)}" for T, code in failed.items()))

    def _run_task(self, task: ColdTask) -> None:
        """The CPU kernel over the staged buffers: a host function on the side stream with a GPU, a call
        now on the CPU (where the copies before it are already done)."""
        if self.libcuda is None:
            self.kernel.lib.ost_cold_task_run(ctypes.byref(task))
            return
        rc = self.libcuda.cuLaunchHostFunc(ctypes.c_void_p(self.side.cuda_stream), self.fn,
                                          ctypes.c_void_p(ctypes.addressof(task)))
        if rc != 0:
            raise RuntimeError(f"cuLaunchHostFunc failed with CUresult {rc}")
