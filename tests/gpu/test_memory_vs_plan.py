"""GPU memory after load against the plan: an engine filled to the plan's context (its decode graphs
captured at the last position) holds, per planned row and component, what the plan says (tol 1%;
runtime/engine/held_memory.py files each tensor), and the CUDA allocator grew by no more than the plan's
row without its headroom."""

from __future__ import annotations

import gc

import pytest
import torch

from ostinato.bench.gpu_setup import CONTEXT, sync
from ostinato.runtime.engine.held_memory import BOUNDS, held_memory

pytestmark = pytest.mark.gpu


def test_an_engine_filled_to_its_context_holds_what_the_plan_says(h200, figure):
    plan = h200.plan
    gpus = range(plan.hardware.gpus.count)
    gc.collect()  # an earlier test's garbage must not be freed inside the measurement
    before = {gpu: torch.cuda.memory_allocated(gpu) for gpu in gpus} if h200.cuda else {}
    engine = h200.engine(graphs=True)
    try:
        session = engine.new_session()
        vocab = engine.model.config.vocab_size
        ids = torch.randint(0, vocab, (CONTEXT - 1,), generator=torch.Generator().manual_seed(1))
        session.prefill(ids[: CONTEXT // 2], last_only=True)
        session.prefill(ids[CONTEXT // 2:], last_only=True)
        session.decode(0)  # the last planned position, through the decode step (captured on the first decode)
        sync(h200.device)
        held = held_memory(engine, [session])
        grown = {gpu: torch.cuda.memory_allocated(gpu) - before[gpu] for gpu in gpus} if h200.cuda else {}
    finally:
        engine.close()
    over = []
    for m in plan.memory:
        if m.device == "host":
            continue
        planned = sum(b for c, b in m.components.items() if c not in BOUNDS)
        got = sum(b for c, b in held.rows.get(m.device, {}).items() if c not in BOUNDS)
        figure(f"held/plan_{m.device}", got / planned)
        if h200.cuda:
            bound = m.total_bytes - m.components.get("headroom", 0)
            grew = grown[int(m.device.removeprefix("gpu"))]
            figure(f"alloc/plan_{m.device}", grew / bound)
            if grew > bound:
                over.append(f"{m.device}: memory_allocated grew {grew:,d} B, the plan less headroom is {bound:,d} B")
    assert held.differences(plan, 0.01) == []
    assert over == []
