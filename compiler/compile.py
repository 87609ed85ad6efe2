"""ostinato-compile as one visible, ordered list of named passes: (model, profile, hardware) -> plan.

  read_model -> read_profile -> read_hardware -> read_workloads -> memory -> placement -> cost_model -> shard_copy
  -> buckets -> replan -> speculation -> policy -> kernels -> plan

Each pass reads what earlier passes put in the `Build` and adds its own result; each is logged. Each lives in
its own module of compiler/passes/ (its __init__ is the map). Planning reads only config.json, the index and
safetensors headers, never weights.

The re-plan loop: memory, placement, cost_model, shard_copy and buckets (PLACE) rest on what memory reserves. Two later
passes change that and return why; PLACE then runs again, in order, each logged as `pass WHO: PASS WHY`:
- replan: the buckets kept are smaller than the graph pool memory reserved (more room for hot experts);
- speculation: the MTP block, placed beside the head, does not pay (its memory goes back to the layers).
Inside placement, memory and placement iterate on their own where the plan does not fit: without the MTP
block (--speculative auto), then without bucket steps (passes/placement.py).

How the workloads price the plan's choices: passes/least_wait.py; the MTP block: passes/speculation.py.
"""

from __future__ import annotations

import logging

from .passes.buckets import buckets
from .passes.build import Build
from .passes.cost_model import cost_model
from .passes.kernels import kernels
from .passes.least_wait import least_wait as _least_wait  # noqa: F401 (tests/test_plan_workload.py prices with it)
from .passes.memory import memory
from .passes.options import (
    ADAPT,
    CHAT_ENCODINGS,
    CPU_STEP,
    DEFAULT_CONTEXT,
    DEFAULT_WORKLOADS,
    SPECULATIVE,
    CompileError,
    CompileOptions,
)
from .passes.placement import placement
from .passes.plan import plan
from .passes.policy import policy
from .passes.predictions import predictions_position
from .passes.read_hardware import read_hardware
from .passes.read_model import read_model
from .passes.read_profile import read_profile
from .passes.read_workloads import read_workloads
from .passes.replan import replan
from .passes.shard_copy import shard_copy
from .passes.speculation import MIN_MEASURED_DRAFTS, speculation

__all__ = ["ADAPT", "CHAT_ENCODINGS", "CPU_STEP", "DEFAULT_CONTEXT", "DEFAULT_WORKLOADS", "MIN_MEASURED_DRAFTS",
           "PASSES", "PLACE", "SPECULATIVE", "Build", "CompileError", "CompileOptions", "compile_plan",
           "predictions_position"]

log = logging.getLogger("ostinato.compile")

PASSES = (read_model, read_profile, read_hardware, read_workloads, memory, placement, cost_model, shard_copy, buckets,
          replan, speculation, policy, kernels, plan)
PLACE = (memory, placement, cost_model, shard_copy, buckets)  # the passes the re-plan loop runs again


def compile_plan(options: CompileOptions, on_pass=lambda name: None) -> Build:
    """The passes in order, each logged; `on_pass(name)`: told as each starts (the CLI's progress bar)."""
    b = Build(options)
    for p in PASSES:
        log.info("pass %s", p.__name__)
        on_pass(p.__name__)
        why = p(b)
        if why:  # the re-plan loop: what PLACE rests on changed
            for again in PLACE:
                log.info("pass %s: %s %s", p.__name__, again.__name__, why)
                again(b)
    return b
