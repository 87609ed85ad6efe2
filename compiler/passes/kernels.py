"""kernels: render and build the kernels the plan needs (codegen/plan_kernels.py), unless there are no weights
to run them on or --no-kernels."""

from __future__ import annotations

from ..codegen.plan_kernels import build_plan_kernels
from .build import Build


def kernels(b: Build) -> None:
    if not b.has_weights:
        b.notes.append("kernels: skipped (no weights present)")
        return
    if not b.options.build_kernels:
        b.notes.append("kernels: skipped (--no-kernels)")
        return
    b.kernels, b.templates = build_plan_kernels(b)
