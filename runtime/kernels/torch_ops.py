"""The `ostinato` torch op namespace the plan's generated kernels are registered in (hc_mix.py, dense_ops.py).

Each op dispatches once from Python, shows in op traces (the dispatch counter, the graph-safety checker)
and can be captured in a CUDA graph. Registered through torch.library.Library rather than the
custom_op decorator: the same dispatch for about half the Python overhead (docs/benchmarks.md), which
is what these ops exist to save. An op's `kernel` argument is the handle of the
loaded kernel object (`register`) whose method implements it: one process can hold several plans.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIB = torch.library.Library("ostinato", "FRAGMENT")
_LOADED: list = []  # a kernel object per handle


def define(schema: str, impl: Callable, meta: Callable) -> None:
    """Define `ostinato::<schema>` with `impl` for CPU and CUDA tensors and `meta` for shapes only."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    for key in ("CPU", "CUDA"):
        _LIB.impl(name, impl, key)
    _LIB.impl(name, meta, "Meta")


def register(kernel) -> int:
    """A handle for `kernel`, the int the ops take as their `kernel` argument."""
    _LOADED.append(kernel)
    return len(_LOADED) - 1


def loaded(handle: int):
    return _LOADED[handle]
