"""Which generated dense-op kernels the current forward may use (kernels/dense_ops.py), if any.

The norms and rope are free functions called from every sublayer; rather than thread a kernel object
through all of them, the model sets it for the duration of a forward (`with using(model.dense_ops)`)
and the functions ask `active()`. A model loaded without a plan never sets one, so it runs the torch
reference; a context variable keeps concurrent forwards in other threads apart.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

_ACTIVE: ContextVar = ContextVar("ostinato_dense_ops", default=None)


def active():
    """The DenseOpsKernel of the forward running in this thread, or None (the reference)."""
    return _ACTIVE.get()


@contextmanager
def using(kernels):
    """Run the block with `kernels` active (None: the reference)."""
    token = _ACTIVE.set(kernels)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
