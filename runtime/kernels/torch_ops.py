"""The `ostinato` torch op namespace the plan's generated kernels are registered in (hc_mix.py, dense_ops.py).

Each op dispatches once from Python, shows in op traces (the dispatch counter, the graph-safety checker)
and can be captured in a CUDA graph. Registered through torch.library.Library rather than the
custom_op decorator: the same dispatch for about half the Python overhead (docs/benchmarks.md), which
is what these ops exist to save. An op's `kernel` argument is the handle of the
loaded kernel object (`register`) whose method implements it: one process can hold several plans.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

_LIB = torch.library.Library("ostinato", "FRAGMENT")
_LOADED: list = []  # a weak reference to a kernel object per handle


def define(schema: str, impl: Callable, meta: Callable) -> None:
    """Define `ostinato::<schema>` with `impl` for CPU and CUDA tensors and `meta` for shapes only."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, impl, key)
    _LIB.impl(name, meta, "Meta")


def register(kernel) -> int:
    """A handle for `kernel`, the int the ops take as their `kernel` argument. Held weakly: an engine's
    kernels and executor go when the engine goes (a process may load many)."""
    _LOADED.append(weakref.ref(kernel))
    return len(_LOADED) - 1


def loaded(handle):
    """The kernel object of `handle` (an int, or a 0-d int64 tensor: see handle_tensor)."""
    handle = int(handle)
    kernel = _LOADED[handle]()
    if kernel is None:
        raise RuntimeError(f"ostinato op handle {handle}: its kernel object was freed (its engine is gone)")
    return kernel


def handle_tensor(handle: int) -> torch.Tensor:
    """`handle` as a 0-d int64 CPU tensor, for ops a compiled step calls: torch.compile bakes an int
    argument into the generated code (so two engines' otherwise identical steps would be generated
    twice), a tensor argument it passes at run time (engine/cpu_step.py)."""
    return torch.tensor(handle, dtype=torch.int64)
