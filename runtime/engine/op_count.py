"""Count the torch ops a forward dispatches: what the cost model's EAGER_OPS_PER_LAYER stands for.

Every op that goes through PyTorch's dispatcher from Python costs host time (~4-8 us here) whether it
moves 16 bytes or 16 MB; on the short forwards after a tool output that overhead, not the arithmetic,
sets the wait. `OpCounter` is a dispatch mode that counts ops (by name and by the runtime function that
issued them); `ops_per_layer` measures an engine the way tests/test_cost_model_dispatch.py and
bench/count_ops.py report it. Calls into the plan's C kernels through ctypes are not torch ops and
are not counted (one per layer at most: the cold or hot expert task).
"""

from __future__ import annotations

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
