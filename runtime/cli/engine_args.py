"""The options that load a plan's engine, shared by ostinato-run and ostinato-serve: one spelling, one loader."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

DTYPES = {None: None, "float32": torch.float32, "bfloat16": torch.bfloat16}


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", type=Path, help="plan.yaml")
    p.add_argument("--model", type=Path, help="checkpoint directory, when it moved since compile (default: the "
                                              "plan's model.path, relative to the plan file)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="cpu maps every planned GPU to the CPU; cuda requires "
                                                             "CUDA (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"),
                   help="compute dtype (default: the plan's model.dense_format); another one only with --device cpu")
    p.add_argument("--hot-backend", choices=("cpu", "torch", "triton"),
                   help="hot-expert compute: triton (default on GPUs), cpu (the plan's CPU expert kernel; default on "
                        "the CPU) or torch (the dequantize-and-matmul reference)")
    p.add_argument("--decode", choices=("graph", "eager", "dynamic"), default="graph",
                   help="decode steps: graph = the fixed-shape step as one call per device: a CUDA graph per GPU, "
                        "on the CPU compiled into one call (the plan's policy.cpu_step; OSTINATO_CPU_STEP=eager "
                        "overrides it); eager = that step op by op; dynamic = the model's own forward (growing cache)")
    p.add_argument("--adapt", choices=("off", "idle"),
                   help="idle: after each turn, swap hot experts toward the session's own routes while the agent's "
                        "tool runs (exact: each swap lands between forwards); off: the plan's hot set throughout "
                        "(default: the plan's policy.adapt)")
    p.add_argument("--speculative", choices=("off", "mtp"),
                   help="mtp: draft each next token with the checkpoint's MTP block and verify it with the one "
                        "before in one 2-token step (greedy output unchanged, sampled output distributed as "
                        "without); off: plain decoding (default: the plan's policy.speculative)")


def _decode_label(mode: str, engine) -> str:
    if mode == "graph" and not any(d.type == "cuda" for d in engine.devices):
        runner = engine.step_runner
        if runner is not None and runner.cpu_step == "compiled":
            return "fixed-shape step, compiled (one call per token)"
        return f"fixed-shape step, eager ({runner.cpu_step_note if runner is not None else 'no GPU'})"
    return {"graph": "CUDA graph per GPU", "eager": "fixed-shape step, eager", "dynamic": "dynamic forward"}[mode]


def load_engine_from_args(a: argparse.Namespace):
    """The engine the options ask for, with its one-line summary printed. Raises PlanError / CheckpointError."""
    if a.hot_backend == "triton" and (a.device == "cpu" or not torch.cuda.is_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is first imported
    from ..engine.loader import load_engine
    from ..engine.resident import resident, resident_line

    engine = load_engine(a.plan, a.model, a.device, DTYPES[a.dtype], a.hot_backend,
                         static_decode=a.decode != "dynamic", decode_graphs=a.decode == "graph",
                         progress=None, speculative=a.speculative, adapt=a.adapt,  # bars: on a terminal
                         parallel=getattr(a, "parallel", 1))  # ostinato-serve's
    print(f"plan {a.plan}: {engine.plan.model.layers} layers on {engine.plan.hardware.name} "
          f"(devices: {', '.join(sorted({str(d) for d in engine.devices}))}), "
          f"prefill threshold {engine.plan.policy.prefill_threshold}"
          f"{f', shard threshold {engine.plan.policy.shard_threshold}' if engine.plan.policy.shard_threshold else ''}"
          f", decode: {_decode_label(a.decode, engine)}"
          f"{' with MTP speculation' if engine.speculative else ''}"
          f"{', hot set re-placed between turns' if engine.adapter else ''}"
          f"{f', {engine.parallel} sessions decoding together' if engine.parallel > 1 else ''}, "
          f"{engine.cpu_threads.describe()}")
    print(resident_line(resident(), engine.plan, engine.devices), flush=True)
    return engine
