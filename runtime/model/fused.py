"""Which generated dense-op kernels the current forward may use (kernels/dense_ops.py), if any.

The norms and rope are free functions called from every sublayer; rather than thread a kernel object
through all of them, the model sets it for the duration of a forward (`with using(model.dense_ops)`)
and the functions ask `active()`. A model loaded without a plan never sets one, so it runs the torch
reference; a context variable keeps concurrent forwards in other threads apart.

A step compiled with torch.compile (engine/cpu_step.py) cannot read a context variable while it is
traced, so its kernels are set with `compiled_with(kernels)` around the trace and every call: the
trace bakes them in and its guard checks they are the same object on every call. While tracing,
`inductor_generates()` is true: the row-wise kernels (norms, mHC mixing) are then left to Inductor,
which generates them fused with their neighbours, where an opaque op would cost a call from the
compiled code back into Python.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch

_ACTIVE: ContextVar = ContextVar("ostinato_dense_ops", default=None)
_COMPILED: list = [None]  # the kernels of the compiled step being traced or called


def active():
    """The DenseOpsKernel of the forward running in this thread, or None (the reference)."""
    if torch.compiler.is_compiling():
        return _COMPILED[0]
    return _ACTIVE.get()


def inductor_generates() -> bool:
    """Whether torch.compile is tracing (it then generates the row-wise ops itself, see above)."""
    return torch.compiler.is_compiling()


@contextmanager
def compiled_with(kernels):
    """Around a compiled step's trace and every call of it: the kernels it bakes in."""
    previous, _COMPILED[0] = _COMPILED[0], kernels
    try:
        yield
    finally:
        _COMPILED[0] = previous


@contextmanager
def using(kernels):
    """Run the block with `kernels` active (None: the reference)."""
    token = _ACTIVE.set(kernels)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
