"""The MEASURED half: the real engine on this machine (--device cpu, tiny model with planted popularity)
under each policy as a plan variant of one engine, on the same shrunk sessions, plus exactness (greedy
tokens identical across policies) and a calibration of the cost model (cpu-only preset) against the
executor's counters. On a CPU-only machine this shows engine overheads and correctness, not GPU speed.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ostinato.bench.lru_executor import lru_cache_engine
from ostinato.bench.simulator.bench import by_workload
from ostinato.bench.simulator.replay import simulate
from ostinato.bench.simulator.trace import TraceSampler
from ostinato.bench.simulator.world import build_world
from ostinato.compiler.compile import CompileOptions, compile_plan
from ostinato.runtime.engine.loader import load_engine
from ostinato.tiny import write_tiny_checkpoint
from ostinato.workload import TokenSource, shrink_sessions


def _variants(plan, E):
    """Ostinato's plan; all experts cold (KTransformers-like: routed experts on the CPU; its layerwise
    prefill is not a mode of this engine); layer placement (first half of the layers all-hot, the rest cold)."""
    L = len(plan.layers)
    def make(hot_of, threshold):
        layers = [lp.replace(hot_experts=hot_of(lp)) for lp in plan.layers]
        return plan.replace(layers=layers, policy=plan.policy.replace(prefill_threshold=threshold))
    return {"Ostinato": plan,
            "all-cold (KTransformers-like)": make(lambda lp: [], None),
            "layer placement (llama.cpp-like)": make(lambda lp: list(range(E)) if lp.layer < L // 2 else [], 31)}


def _replay(engine, sessions, model_dir, vocab, seed):
    warm = engine.new_session()  # first calls pay one-time setup (allocations, kernel loads): not the policy's
    warm.decode(int(warm.prefill(TokenSource(model_dir, vocab, seed).take(40))[-1].argmax()))
    c0 = engine.executor.counters.copy()
    waits, tokens, decode_s, gen, t0 = [], [], 0.0, 0, time.perf_counter()
    for i, s in enumerate(sessions):
        src, sess, nxt = TokenSource(model_dir, vocab, seed + i), engine.new_session(), None
        for j, turn in enumerate(s.turns):
            start = time.perf_counter()
            nxt = int(sess.prefill(src.take(turn.appended))[-1].argmax())
            nxt = int(sess.decode(nxt).argmax())
            if j:
                waits.append(time.perf_counter() - start)
            tokens.append(nxt)
            d0 = time.perf_counter()
            for _ in range(turn.generated - 1):
                nxt = int(sess.decode(nxt).argmax())
                tokens.append(nxt)
            decode_s, gen = decode_s + time.perf_counter() - d0, gen + turn.generated - 1
    return dict(wait=float(np.median(waits)), p90=float(np.percentile(waits, 90)), tps=gen / decode_s,
                session=time.perf_counter() - t0, tokens=tokens, counters=engine.executor.counters.minus(c0))


def run_measured(all_sessions, out: Path, seed: int = 0) -> str:
    work = Path(tempfile.mkdtemp(prefix="ostinato-bench-"))
    ckpt = write_tiny_checkpoint(work / "tiny", "tiny", seed=0, popularity=1.0, progress=False)
    shrunk = shrink_sessions([group[0] for group in by_workload(all_sessions, 1).values()][:2],
                             scale=0.1, max_turns=6, max_generated=8)
    prof = work / "profile.safetensors"
    subprocess.run([sys.executable, "-m", "ostinato.runtime.cli.record", str(ckpt), "--sessions",
                    str(Path(__file__).resolve().parents[1] / "plans/workloads/agent_turns.csv"), "-o", str(prof),
                    "--first-session", "40", "--limit-sessions", "2", "--limit-turns", "6", "--scale", "0.1",
                    "--max-generated", "8", "--quiet"], check=True, capture_output=True)
    build = compile_plan(CompileOptions(ckpt, work / "plan.yaml", "cpu-only", profile=str(prof), context=4096,
                                        max_hot_per_layer=6, kernel_dir=work / "kernels"))
    plan = build.plan.replace(policy=build.plan.policy.replace(prefill_threshold=64))
    build = dataclasses.replace(build, plan=plan, threshold=64)
    res = {}
    variants = _variants(plan, plan.model.routed_experts)
    for name, variant in variants.items():
        engine = load_engine(variant, ckpt, device="cpu", speculative="off")
        res[name] = _replay(engine, shrunk, ckpt, build.config.vocab_size, seed)
        engine.close()
    # llama.cpp's LRU expert cache: as many experts per layer as Ostinato's hot set, warm with it
    cold = load_engine(variants["all-cold (KTransformers-like)"], ckpt, device="cpu", speculative="off")
    engine = lru_cache_engine(cold, [list(lp.hot_experts) for lp in plan.layers])
    res["LRU expert cache (llama.cpp-like)"] = _replay(engine, shrunk, ckpt, build.config.vocab_size, seed)
    engine.close()
    base = res["Ostinato"]
    rows = ["### measured (CPU): real engine, tiny model, --device cpu, "
            f"{len(shrunk)} shrunk sessions ({sum(len(s.turns) for s in shrunk)} turns), one run", "",
            "On a CPU-only machine this shows engine overheads and correctness, not GPU speed.", "",
            "| policy (plan variant) | median wait ms | p90 wait ms | decode tok/s | session s | wait / Ostinato | "
            "session / Ostinato | greedy tokens = Ostinato |", "|---|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        rows.append(f"| {name} | {r['wait'] * 1e3:.1f} | {r['p90'] * 1e3:.1f} | {r['tps']:.1f} | {r['session']:.2f} | "
                    f"{r['wait'] / base['wait']:.2f}x | {r['session'] / base['session']:.2f}x | "
                    f"{'yes' if r['tokens'] == base['tokens'] else 'NO'} |")
    rows += ["", calibration(build, shrunk, base["counters"], seed)]
    text = "\n".join(rows)
    (out / "measured.md").write_text(text + "\n")
    return text


def calibration(build, sessions, measured, seed) -> str:
    """The simulator's Ostinato parts on the cpu-only preset (profile shares, not the real routing) vs the
    executor's counters on the same sessions."""
    world = build_world(build=build)
    runs = simulate(sessions, world.policies()[:1], TraceSampler(world.shares, build.config.num_experts_per_tok, seed))
    turns = [t for s in runs["Ostinato"] for t in s.turns]
    model = {"hot (GPU experts) s": sum(t.prefill.gpu_experts_s + t.decode.gpu_experts_s for t in turns),
             "cold (host experts) s": sum(t.prefill.cpu_experts_s + t.decode.cpu_experts_s for t in turns),
             "upload s": sum(t.prefill.upload_s + t.decode.upload_s for t in turns)}
    meas = {"hot (GPU experts) s": measured.hot_s, "cold (host experts) s": measured.cold_s,
            "upload s": measured.upload_s}
    rows = ["### calibration: cost model (cpu-only preset) vs measured executor counters, Ostinato plan", "",
            "| component | modeled s | measured s | measured / modeled |", "|---|---|---|---|"]
    for k in model:
        ratio = f"{meas[k] / model[k]:.1f}x" if model[k] > 0 else "-"
        rows.append(f"| {k} | {model[k]:.4f} | {meas[k]:.4f} | {ratio} |")
    return "\n".join(rows)
