"""read_workloads: the workloads the plan's choices are priced on (least_wait.py), and the idle period of the
re-placement budget from the idle times they record."""

from __future__ import annotations

from pathlib import Path

from ostinato.adaptation import idle_budget_s
from ostinato.workload import summarize_workload

from .build import Build
from .options import CompileError


def read_workloads(b: Build) -> None:
    names: dict[str, Path] = {}
    for path in b.options.workloads:
        w = summarize_workload(path)
        if w.name in names:  # the plan names workloads by file name (machine-independent)
            raise CompileError(f"--workload {path}: another workload has the same file name ({names[w.name]}); the "
                               f"plan names each by its file name, so give them different ones")
        names[w.name] = Path(path)
        b.workloads.append(w)
    b.idle_s, b.idle_from = idle_budget_s({w.name: w.idle_s for w in b.workloads})
