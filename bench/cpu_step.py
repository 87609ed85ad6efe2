"""MEASURED, side by side on this machine: the CPU decode step eager (op by op) and compiled into one call
(runtime/engine/cpu_step.py), the same plan loaded twice, decoding the same session in alternating rounds.

    python -m ostinato.bench.cpu_step PLAN [--rounds 5] [--tokens 40] [--context 150]

Per step: milliseconds (median of the rounds), Python torch calls (op_count.PythonTorchCalls) and, for the
eager step, aten ops (op_count.OpCounter). The last line is what the cost model's cpu-only decode pricing
takes from here (compiler/cost_model/forward.py, COMPILED_STEP_OPS_PER_LAYER): the compiled step's time per layer
in the units the spec's host.op_dispatch_s is measured in, the eager step's time per aten op, i.e.
    compiled_step_ops_per_layer = aten ops per layer (eager) x compiled ms / eager ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from ostinato.host import cpu_model
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.op_count import OpCounter, PythonTorchCalls


def _session(engine, context: int, seed: int = 0):
    s = engine.new_session()
    s.prefill(torch.randint(0, 1000, (context,), generator=torch.Generator().manual_seed(seed)))
    s.decode(5)  # binds the static state
    return s


def _ms_per_step(session, tokens: int) -> float:
    start = time.perf_counter()
    for i in range(tokens):
        session.decode(7 + i % 50)
    return (time.perf_counter() - start) / tokens * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=40, help="decode steps per round and engine (40)")
    p.add_argument("--context", type=int, default=150, help="prompt tokens before decoding (150)")
    a = p.parse_args(argv)
    engines = {mode: load_engine(a.plan, device="cpu", speculative="off", adapt="off", cpu_step=mode, progress=None)
               for mode in ("eager", "compiled")}
    if engines["compiled"].step_runner.cpu_step != "compiled":
        raise SystemExit(f"the compiled step is not available: {engines['compiled'].step_runner.cpu_step_note}")
    layers = engines["eager"].plan.model.layers
    sessions = {mode: _session(e, a.context) for mode, e in engines.items()}
    calls = {}
    for mode, s in sessions.items():
        with PythonTorchCalls() as c:
            s.decode(3)
        calls[mode] = c.calls
    with OpCounter() as ops:
        sessions["eager"].decode(4)
    for s in sessions.values():
        _ms_per_step(s, 5)  # warm
    times = {mode: [] for mode in sessions}
    load = os.getloadavg()[0]
    for _ in range(a.rounds):
        for mode, s in sessions.items():
            times[mode].append(_ms_per_step(s, a.tokens))
    ms = {mode: statistics.median(t) for mode, t in times.items()}
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, load average {load:.2f} -> {os.getloadavg()[0]:.2f}; "
          f"{a.plan}: {layers} layers, {a.rounds} alternating rounds of {a.tokens} steps")
    print("| step | ms per token | tokens/s | Python torch calls per step | aten ops per layer |")
    print("|---|---|---|---|---|")
    print(f"| eager | {ms['eager']:.2f} | {1e3 / ms['eager']:.1f} | {calls['eager']} | {ops.ops / layers:.0f} |")
    print(f"| compiled | {ms['compiled']:.2f} | {1e3 / ms['compiled']:.1f} | {calls['compiled']} | - |")
    rounds = {mode: ", ".join(f"{t:.2f}" for t in ts) for mode, ts in times.items()}
    print(f"compiled / eager speed: {ms['eager'] / ms['compiled']:.2f}x (rounds: eager {rounds['eager']}; "
          f"compiled {rounds['compiled']})")
    per_layer = ops.ops / layers * ms["compiled"] / ms["eager"]
    print(f"compiled_step_ops_per_layer={per_layer:.0f} eager_ops_per_layer={ops.ops / layers:.0f} "
          f"python_calls_per_step_compiled={calls['compiled']} python_calls_per_step_eager={calls['eager']}")
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
