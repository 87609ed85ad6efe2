"""Allocation = plan: what a loaded engine holds, per planned GPU and component, is what the plan counted.

Every planned GPU maps to the CPU here; `held_memory` files the engine's tensors by the plan's
layer-to-GPU map, so a CPU run shows what each GPU would hold. A session is filled to the planned
context first, so the KV rows are all there. Bounds (prefill workspace, graph pools, headroom) hold
nothing between forwards and are left out; what no component claims must stay small and known.
This is the check that catches an upload buffer pair per layer instead of per GPU, or dense weights
held in another format than the plan counted.
"""

from __future__ import annotations

import pytest
import torch
from allocation_helpers import TOLERANCE, TWO_GPUS, _check, _compile, _filled_session

from ostinato.runtime.engine.held_memory import held_memory
from ostinato.runtime.engine.loader import load_engine

pytestmark = pytest.mark.slow  # compiled plans, sessions filled to the planned context

CONTEXT = 512


@pytest.mark.parametrize("dense_format,speculative", [("float32", "off"), ("bf16", "mtp"), ("fp8", "mtp")])
def test_a_two_gpu_plan_holds_what_it_counted(tiny_ckpt, tmp_path, kernel_dir, dense_format, speculative):
    """With speculation the MTP block too: its dense part, hot experts and cache, the drafts' static state."""
    plan = _compile(tiny_ckpt, tmp_path, TWO_GPUS, kernel_dir, context=CONTEXT, prefill_chunk=256,
                    max_hot_per_layer=5, dense_format=dense_format, speculative=speculative)
    assert (plan.mtp is not None) == (speculative == "mtp")
    assert {lp.gpu for lp in plan.layers} == {0, 1} and all(lp.hot_experts for lp in plan.layers)
    engine = load_engine(tmp_path / "plan.yaml", device="cpu")  # the plan's dtype
    assert engine.speculative == (speculative == "mtp")
    assert engine.model.dtype == {"float32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.bfloat16}[dense_format]
    _check(engine, _filled_session(engine, CONTEXT))
    engine.close()


def test_the_check_sees_a_run_in_another_dtype_than_planned(tiny_ckpt, tmp_path, kernel_dir):
    """A float32 run of a bf16 plan (allowed on the CPU, as a reference) holds twice the dense bytes."""
    _compile(tiny_ckpt, tmp_path, TWO_GPUS, kernel_dir, context=CONTEXT, prefill_chunk=256, max_hot_per_layer=5,
             dense_format="bf16")
    engine = load_engine(tmp_path / "plan.yaml", device="cpu", dtype=torch.float32)
    wrong = held_memory(engine, [engine.new_session()]).differences(engine.plan, TOLERANCE)
    assert any(line.startswith("gpu0 dense_weights") for line in wrong), wrong
    engine.close()


def test_a_plan_for_two_sessions_at_once_holds_what_it_counted(tiny_ckpt, tmp_path, kernel_dir):
    """--sessions 2 and --parallel 2: both sessions' caches, the batched steps' state per session."""
    from ostinato.runtime.engine import decode_together

    _compile(tiny_ckpt, tmp_path, TWO_GPUS, kernel_dir, context=CONTEXT, prefill_chunk=256, max_hot_per_layer=5,
             sessions=2)
    engine = load_engine(tmp_path / "plan.yaml", device="cpu", parallel=2)
    g = torch.Generator().manual_seed(1)
    sessions = [engine.new_session() for _ in range(2)]
    for s in sessions:
        s.prefill(torch.randint(0, engine.model.config.vocab_size, (CONTEXT - 1,), generator=g), last_only=True)
    decode_together(sessions, [0, 1])  # the last planned position, both in their batch slots
    held = held_memory(engine, sessions)
    assert not held.differences(engine.plan, TOLERANCE), "\n".join(held.differences(engine.plan, TOLERANCE))
    engine.close()
