"""Helpers of the allocation = plan checks (test_allocation_plan.py, test_make_flash.py): compile a plan
for a hardware spec, fill a session to the planned context, compare what the engine holds with the plan."""

import torch
import yaml

from ostinato.compiler.compile import CompileOptions, compile_plan
from ostinato.compiler.memory_model import CUBLAS_STREAMS, CUBLAS_WORKSPACE_BYTES
from ostinato.runtime.engine.held_memory import held_memory

TOLERANCE = 0.01

TWO_GPUS = {  # small enough that the tiny model's four layers split across both (64 MB besides cuBLAS's workspaces)
    "name": "two-small-gpus", "description": "two small GPUs (allocation test)",
    "gpus": {"name": "small", "count": 2, "usable_bytes": 64_000_000 + CUBLAS_STREAMS * CUBLAS_WORKSPACE_BYTES,
             "bandwidth": 1.0e11, "matmul_flops": 1.0e12, "launch_overhead_s": 1.0e-5},
    "host": {"cores": 2, "usable_bytes": 8_000_000_000, "bandwidth": 4.0e10, "matmul_flops": 1.0e11, "isa": "avx2",
             "op_dispatch_s": 1.0e-5, "task_handoff_s": 0.0},
    "link": {"h2d_bandwidth": 1.0e10, "d2h_bandwidth": 1.0e10, "latency_s": 1.0e-6}}


def _compile(ckpt, work, hardware: dict, kernel_dir=None, **options):
    """The plan for `hardware` in work/plan.yaml; kernels in `kernel_dir` (the session's), else work/kernels."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "hw.yaml").write_text(yaml.safe_dump(hardware))
    kernel_dir = kernel_dir if kernel_dir is not None else work / "kernels"
    plan = compile_plan(CompileOptions(ckpt, work / "plan.yaml", str(work / "hw.yaml"),
                                       kernel_dir=kernel_dir, **options)).plan
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
    # table (512 KiB per device in float32; the Triton backend on GPUs has none), and where the plan shards its
    # uploads the slices' torch compute's own, one per device (the plan's expert kernels are built for the
    # whole width: runtime/engine/sharded_upload.py)
    table = sum(b for path, b in held.unplanned if "compute._tables" in path)
    sharded = engine.executor.sharded
    assert table <= (1 + (len(set(sharded.devices)) if sharded is not None else 0)) * 2 * 256 * 256 * 4
    rest = [(path, b) for path, b in held.unplanned if "compute._tables" not in path]
    assert sum(b for _, b in rest) <= 0.001 * planned, sorted(rest, key=lambda pb: -pb[1])[:10]
