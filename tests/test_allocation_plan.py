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
import yaml

from ostinato.compiler.compile import CompileOptions, compile_plan
from ostinato.runtime.engine.held_memory import held_memory
from ostinato.runtime.engine.loader import load_engine

TOLERANCE = 0.01
CONTEXT = 512

TWO_GPUS = {  # small enough that the tiny model's four layers split across both
    "name": "two-small-gpus", "description": "two small GPUs (allocation test)",
    "gpus": {"name": "small", "count": 2, "usable_bytes": 64_000_000, "bandwidth": 1.0e11, "matmul_flops": 1.0e12,
             "launch_overhead_s": 1.0e-5},
    "host": {"cores": 2, "usable_bytes": 8_000_000_000, "bandwidth": 4.0e10, "matmul_flops": 1.0e11, "isa": "avx2",
             "op_dispatch_s": 1.0e-5},
    "link": {"h2d_bandwidth": 1.0e10, "d2h_bandwidth": 1.0e10, "latency_s": 1.0e-6}}


def _compile(ckpt, work, hardware: dict, **options):
    work.mkdir(parents=True, exist_ok=True)
    (work / "hw.yaml").write_text(yaml.safe_dump(hardware))
    plan = compile_plan(CompileOptions(ckpt, work / "plan.yaml", str(work / "hw.yaml"),
                                       kernel_dir=work / "kernels", **options)).plan
    plan.write(work / "plan.yaml")
    return plan


def _filled_session(engine, context: int):
    session = engine.new_session()
    ids = torch.randint(0, engine.model.config.vocab_size, (context - 1,), generator=torch.Generator().manual_seed(0))
    session.prefill(ids[: context // 2], last_only=True)
    session.prefill(ids[context // 2:], last_only=True)
    session.decode(0)  # the last planned position, through the decode step (whose state is then full too)
    return session


def _check(engine, session) -> None:
    held = held_memory(engine, [session])
    assert not held.differences(engine.plan, TOLERANCE), "\n".join(held.differences(engine.plan, TOLERANCE))
    for m in engine.plan.memory:  # snapshots: as many as turns so far, up to the planned count
        assert held.rows.get(m.device, {}).get("kv_snapshots", 0) <= m.components.get("kv_snapshots", 0)
    planned = sum(m.total_bytes for m in engine.plan.memory)
    # known, small: the decode step's 1-token I/O buffers and the torch hot backend's dequantization
    # table (512 KiB per device in float32; the Triton backend on GPUs has none)
    table = sum(b for path, b in held.unplanned if "compute._tables" in path)
    assert table <= 2 * 256 * 256 * 4
    rest = [(path, b) for path, b in held.unplanned if "compute._tables" not in path]
    assert sum(b for _, b in rest) <= 0.001 * planned, sorted(rest, key=lambda pb: -pb[1])[:10]


@pytest.mark.parametrize("dense_format", ["float32", "bf16", "fp8"])
def test_a_two_gpu_plan_holds_what_it_counted(tiny_ckpt, tmp_path, dense_format):
    plan = _compile(tiny_ckpt, tmp_path, TWO_GPUS, context=CONTEXT, prefill_chunk=256, max_hot_per_layer=5,
                    dense_format=dense_format)
    assert {lp.gpu for lp in plan.layers} == {0, 1} and all(lp.hot_experts for lp in plan.layers)
    engine = load_engine(tmp_path / "plan.yaml", device="cpu")  # the plan's dtype
    assert engine.model.dtype == {"float32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.bfloat16}[dense_format]
    _check(engine, _filled_session(engine, CONTEXT))
    engine.close()


def test_the_check_sees_a_run_in_another_dtype_than_planned(tiny_ckpt, tmp_path):
    """A float32 run of a bf16 plan (allowed on the CPU, as a reference) holds twice the dense bytes."""
    _compile(tiny_ckpt, tmp_path, TWO_GPUS, context=CONTEXT, prefill_chunk=256, max_hot_per_layer=5,
             dense_format="bf16")
    engine = load_engine(tmp_path / "plan.yaml", device="cpu", dtype=torch.float32)
    wrong = held_memory(engine, [engine.new_session()]).differences(engine.plan, TOLERANCE)
    assert any(line.startswith("gpu0 dense_weights") for line in wrong), wrong
    engine.close()
