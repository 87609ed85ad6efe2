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
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode


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
