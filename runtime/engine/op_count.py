"""Count the torch ops a forward dispatches: what the cost model's EAGER_OPS_PER_LAYER stands for.

Every op that goes through PyTorch's dispatcher from Python costs host time (~4-8 us here) whether it
moves 16 bytes or 16 MB; on the short forwards after a tool output that overhead, not the arithmetic,
sets the wait. `OpCounter` is a dispatch mode that counts ops (by name and by the runtime function that
issued them); `ops_per_layer` measures an engine the way tests/test_cost_model_dispatch.py and
bench/count_ops.py report it. Calls into the plan's C kernels through ctypes are not torch ops and
are not counted (one per layer at most: the cold or hot expert task).

A dispatch mode cannot watch a compiled step (engine/cpu_step.py: torch.compile runs the step eagerly
while one is active), and the point there is what Python still issues. `PythonTorchCalls` counts exactly
that: the torch functions and tensor methods Python code calls (sys.setprofile), metadata reads such as
`data_ptr` or `numel` left out, whatever runs in between in C++. Each such call is one trip through the
Python bindings and the dispatcher; composite ones expand into several aten ops, so on an eager forward it
reads lower than OpCounter.

`KernelCounter` counts what a GPU would run instead: the device kernels of a step (each one a node of its
CUDA graph, with its launch and tail however little it computes), counted on the CPU twin, where the same
Python issues the same ops: every dispatched aten op that computes (views and bare allocations are no
kernels) and every Triton launch through kernels/launch.py, whatever the launch does inside (the
interpreter's copies are not the GPU's). tests/test_kernel_count.py counts the FP8 decode step so.
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..kernels import launch as launch_module


class OpCounter(TorchDispatchMode):
    """ops: total; by_op: per aten op; by_source (with `sources`): per innermost runtime function."""

    def __init__(self, sources: bool = False):
        super().__init__()
        self.ops, self.by_op, self.by_source, self.sources = 0, Counter(), Counter(), sources

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.by_op[str(func)] += 1
        if self.sources:
            frames = [f for f in traceback.extract_stack()
                      if "/runtime/" in f.filename and not f.filename.endswith("op_count.py")]
            if frames:
                f = frames[-1]
                self.by_source[f"{f.filename.rsplit('/runtime/', 1)[1]}:{f.name}"] += 1
        return func(*args, **(kwargs or {}))


def ops_per_layer(engine, prefills=(1, 16, 128), context: int = 300, sources: bool = False, seed: int = 0
                  ) -> dict[str, tuple[float, OpCounter]]:
    """{"prefill N": (ops per layer, counter), ..., "decode": ..., "step2": ...}: split-route prefills of N
    tokens on top of a `context`-token prompt (tool outputs), then one decode step, in a fresh session; and
    when the engine has a fixed-shape 2-token step (a bucket, the speculative verify), one of it on that
    session, which is then discarded (the cost model's EAGER_STEP_OPS_PER_LAYER)."""
    layers = engine.plan.model.layers
    session = engine.new_session()
    g = torch.Generator().manual_seed(seed)
    session.prefill(torch.randint(0, 1000, (context,), generator=g))
    out = {}
    for n in prefills:
        tokens = torch.randint(0, 1000, (n,), generator=g)
        with OpCounter(sources) as count:
            session.prefill(tokens)
        out[f"prefill {n}"] = (count.ops / layers, count)
    session.decode(int(torch.randint(0, 1000, (1,), generator=g)))  # the first step loads the static state
    with OpCounter(sources) as count:
        session.decode(int(torch.randint(0, 1000, (1,), generator=g)))
    out["decode"] = (count.ops / layers, count)
    runner = engine.step_runner
    if runner is not None and 2 in runner.steps:
        runner.bind(session.session)
        step = runner.steps[2]
        step.set_tokens(torch.randint(0, 1000, (2,), generator=g))
        with OpCounter(sources) as count:
            step.run()
        runner.release()  # the session is thrown away: its cache takes the step's rows, its tokens do not
        out["step2"] = (count.ops / layers, count)
    return out


# Tensor methods that read metadata without dispatching an op.
_METADATA = frozenset({"data_ptr", "numel", "dim", "size", "stride", "is_contiguous", "element_size",
                       "storage_offset", "get_device", "__len__", "is_floating_point", "untyped_storage",
                       "requires_grad_", "__index__", "__int__", "__bool__", "__hash__", "__format__",
                       "is_grad_enabled", "get_num_threads", "is_compiling"})
_TORCH_MODULES = ("torch", "torch.functional", "torch.nn.functional", "torch._C._nn", "torch._C._VariableFunctions",
                  "torch._C._linalg", "torch._C._special")


def _is_torch_call(fn) -> bool:
    name = getattr(fn, "__name__", "")
    if name in _METADATA:
        return False
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.Tensor):
        return True
    if type(fn).__name__ == "OpOverloadPacket" or type(fn).__name__ == "OpOverload":
        return True
    return getattr(fn, "__module__", None) in _TORCH_MODULES and type(fn).__name__ == "builtin_function_or_method"


class PythonTorchCalls:
    """Torch calls from Python in this thread while active: `calls` total, `by_name` per function."""

    def __init__(self):
        self.calls, self.by_name = 0, Counter()

    def _profile(self, frame, event, arg):
        if event == "c_call" and _is_torch_call(arg):
            self.calls += 1
            self.by_name[getattr(arg, "__name__", str(arg))] += 1

    def __enter__(self) -> PythonTorchCalls:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._previous)


RUNTIME = str(Path(__file__).resolve().parents[1])  # the runtime package's folder: sources are named from it
_ALLOCATIONS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})  # no fill


class KernelCounter(TorchDispatchMode):
    """Device kernels issued while active, in this thread: `kernels` total, `by_kernel` per aten op
    ("aten.sum") or Triton kernel ("triton.fp8_linear_kernel"), `by_source` per innermost runtime function
    that issued it ("kernels/fp8_triton.py:_product")."""

    def __init__(self):
        super().__init__()
        self.kernels, self.by_kernel, self.by_source = 0, Counter(), Counter()
        self._launching = 0  # depth inside launch(): what a launch dispatches is the launch's own business

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self._launching and not func.is_view and name not in _ALLOCATIONS:
            self._count(f"aten.{name}", sys._getframe(1))
        return func(*args, **(kwargs or {}))

    def _profile(self, frame, event, arg):
        if frame.f_code is launch_module.launch.__code__:
            if event == "call":
                if not self._launching:
                    kernel = frame.f_locals["kernel"]
                    self._count(f"triton.{getattr(getattr(kernel, 'fn', kernel), '__name__', repr(kernel))}",
                                frame.f_back)
                self._launching += 1
            elif event == "return":
                self._launching -= 1

    def _count(self, kernel: str, frame) -> None:
        self.kernels += 1
        self.by_kernel[kernel] += 1
        while frame is not None:
            path = frame.f_code.co_filename
            if path.startswith(RUNTIME) and not path.endswith(("op_count.py", "launch.py")):
                self.by_source[f"{Path(path).relative_to(RUNTIME).as_posix()}:{frame.f_code.co_name}"] += 1
                return
            frame = frame.f_back

    def from_files(self, *files: str) -> int:
        """Kernels issued from these runtime files (paths relative to the runtime folder)."""
        return sum(n for source, n in self.by_source.items() if source.split(":")[0] in files)

    def __enter__(self) -> KernelCounter:
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        sys.setprofile(self._previous)
