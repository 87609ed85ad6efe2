"""The mHC mixing kernels a plan needs (templates/*/hc_mix.*.j2): the model's stream count, Sinkhorn
iterations and epsilon baked in, for the host (C++) and the GPUs (Triton)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .cxx import BASE_FLAGS, compile_shared
from .render import KernelRecord, render

CPU_TEMPLATE = "cpu/hc_mix.cpp.j2"
TRITON_TEMPLATE = "triton/hc_mix.py.j2"


@dataclass(frozen=True)
class HcMixParams:
    n: int        # hc_mult: residual streams
    iters: int    # hc_sinkhorn_iters
    eps: float    # hc_eps

    def __post_init__(self):
        if not (isinstance(self.n, int) and self.n >= 1):
            raise ValueError(f"hc_mult: {self.n!r} is invalid; allowed: an integer >= 1")
        if not (isinstance(self.iters, int) and self.iters >= 1):
            raise ValueError(f"hc_sinkhorn_iters: {self.iters!r} is invalid; allowed: an integer >= 1")
        if not (isinstance(self.eps, float) and self.eps >= 0):
            raise ValueError(f"hc_eps: {self.eps!r} is invalid; allowed: a float >= 0")

    def template_params(self) -> dict:
        # repr: the shortest text that reads back as the same double (a valid C++ and Python literal)
        return asdict(self) | {"eps": repr(self.eps), "n_padded": 1 << (self.n - 1).bit_length()}


def build_cpu_hc_mix(params: HcMixParams, root: str | Path | None = None) -> KernelRecord:
    """Render and compile the host kernel; the record's path is the shared library."""
    return compile_shared(render(CPU_TEMPLATE, params.template_params(), flags=BASE_FLAGS, root=root))


def render_triton_hc_mix(params: HcMixParams, root: str | Path | None = None) -> KernelRecord:
    """Render the Triton module; the record's path is the .py file."""
    return render(TRITON_TEMPLATE, params.template_params(), root=root)
