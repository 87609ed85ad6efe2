"""MODELED: aggregate decode tok/s when 1, 2, 4 or 8 sessions decode at once, Ostinato beside its baselines as
each batches, on the hardware presets with GPUs, DeepSeek-V4-Flash sizes.

    python -m ostinato.bench.parallel_model [--doc [FILE]]

Each system's step of B running sessions, one token each, is priced by the cost model (compiler/cost_model/decode.py,
batched_decode_step and the module docstring's "Several sessions decoding at once") through its simulator policy
(bench/simulator, Policy.batched_step): Ostinato's fixed-shape batched step (one graph per batch size); KTransformers
as its DeepSeek-V4-Flash recipe serves (--max-running-requests and --cuda-graph-bs, ktransformers.py); llama.cpp's
server with --parallel B (llamacpp.py). Sessions past a system's running limit wait in its queue: its aggregate is
that of the sessions it runs, shared by all B. Each system is priced on the plan compiled for the sessions it holds
(`ostinato-compile --sessions N`: their KV caches take GPU memory from the hot experts, and the baselines get the
same GPU memory for theirs, as in the session tables), at the plan's headline position (compile.predictions_position:
every session that far into its conversation). Routing is the cost model's expectation over the plan's synthetic
profile, no sampled trace. Without flags the block is printed; `--doc` writes it into docs/benchmarks.md (or FILE)
between this tool's markers, at the end under its own heading when it has none yet. tests/test_parallel_model.py
regenerates it and fails on any difference.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from ostinato.bench import session_restore
from ostinato.bench.simulator.kernels import OURS
from ostinato.bench.simulator.ktransformers import (
    DOCUMENTED_THRESHOLD,
    FIRST_RECIPE_GRAPH_BATCHES,
    FIRST_RECIPE_MAX_RUNNING,
    RECIPE_GRAPH_BATCHES,
    RECIPE_MAX_RUNNING,
    KTransformers,
    frequency_placed,
)
from ostinato.bench.simulator.llamacpp import CpuExperts, LayerPlacement
from ostinato.bench.simulator.ostinato_policy import Ostinato
from ostinato.bench.simulator.policy import Policy
from ostinato.bench.simulator.world import PROFILE, V4_FLASH, World, build_world
from ostinato.compiler.compile import DEFAULT_CONTEXT, CompileOptions, compile_plan, predictions_position
from ostinato.compiler.cost_model import UNFUSED_EAGER_OPS_PER_LAYER

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
DOC_HEADING = "## Several sessions decoding at once (modeled)"
DOC_BEGIN = ("<!-- parallel sessions (modeled): written by python -m ostinato.bench.parallel_model --doc; "
             "do not edit -->")
DOC_END = "<!-- end of the parallel sessions table (modeled) -->"
# the compiler's presets with GPUs; the cpu-only one has no price for a batched CPU step's dispatch
# (CostModel.batched_decode_step): bench/parallel_sessions.py measures that on the CPU
PRESETS = ("rtx4090d-x4", "h200-x1")
SESSIONS = (1, 2, 4, 8)
VERDICT_PRESET, VERDICT_SESSIONS = "rtx4090d-x4", 4   # issue 55's "Done when": at least 2x one session's there


@cache
def world(preset: str, sessions: int) -> World:
    """The simulator's world (its kernel table included) of the V4-Flash plan compiled for `sessions` sessions."""
    b = compile_plan(CompileOptions(model=V4_FLASH, output=Path("unused.yaml"), hardware=preset, profile=PROFILE,
                                    context=DEFAULT_CONTEXT, sessions=sessions, build_kernels=False))
    return build_world(build=b)


def _ostinato(w: World) -> Policy:
    return Ostinato(w.cost, w.hot, w.build.threshold, w.build.buckets, shard_threshold=w.build.shard_threshold)


def _kt(w: World) -> KTransformers:
    """KTransformers with frequency-placed GPU experts in the GPU memory Ostinato's hot set gets (World.policies'
    "best"); its prefill threshold does not enter a decode step."""
    L, E = w.hot.shape
    gpu = frequency_placed(w.shares, int(w.hot.sum()) // L)
    return KTransformers(w.cost, DOCUMENTED_THRESHOLD, gpu, w.kernel("kt-kernel"),
                         name=f"KTransformers + frequency GPU experts, --max-running-requests {RECIPE_MAX_RUNNING} "
                              f"--cuda-graph-bs {' '.join(map(str, RECIPE_GRAPH_BATCHES))} (its recipe)")


def _kt_first(w: World) -> KTransformers:
    graphs = " ".join(map(str, FIRST_RECIPE_GRAPH_BATCHES))
    return _kt(w).with_batching(FIRST_RECIPE_MAX_RUNNING, FIRST_RECIPE_GRAPH_BATCHES,
                                f"KTransformers + frequency GPU experts, --max-running-requests "
                                f"{FIRST_RECIPE_MAX_RUNNING} --cuda-graph-bs {graphs} (its first recipe)")


def _n_cpu_moe(w: World) -> Policy:
    L, E = w.hot.shape
    return CpuExperts(w.cost, w.kernel("ggml"), L - int(w.hot.sum()) // E)   # World.policies' "best"


def _layers(w: World) -> Policy:
    return LayerPlacement(w.cost, w.gpu_layers, w.kernel("ggml"))


SYSTEMS: tuple[Callable[[World], Policy], ...] = (_ostinato, _kt, _kt_first, _n_cpu_moe, _layers)


@dataclass(frozen=True)
class Cell:
    sessions: int
    running: int           # the sessions decoding together; the rest wait in the system's queue
    step_s: float          # one step of the running sessions

    @property
    def aggregate(self) -> float:
        return self.running / self.step_s

    @property
    def per_session(self) -> float:
        return self.aggregate / self.sessions


def cells(preset: str, system: Callable[[World], Policy]) -> tuple[str, list[Cell]]:
    """(the system's label, its cells at each of SESSIONS): each priced on the world of the sessions it runs."""
    out, name = [], ""
    for n in SESSIONS:
        running = system(world(preset, n)).running(n)
        policy = system(world(preset, running))
        name = name or policy.name
        at = predictions_position(world(preset, running).build)
        out.append(Cell(n, running, policy.batched_step(running, at)))
    return name, out


@dataclass(frozen=True)
class Holdback:
    """Where the step of `sessions` grows against one session's (Ostinato's plan, cost model parts, seconds)."""
    sessions: int
    steps: tuple[float, float]          # one session's step, the batch's
    before: tuple[float, float]         # the layers' dense parts before their experts, summed
    experts: tuple[float, float]        # the layers' expert sides (hot + shared beside cold + hand-off), summed
    cold: tuple[float, float]           # the batch's distinct cold experts and cold routes, a layer (mean)
    hot: tuple[float, float]            # the batch's hot reads (one per route) and its distinct hot experts, a layer
    grouped_aggregate: float            # tok/s if the hot kernel read each distinct hot expert of the step once
    hot_share: tuple[float, float]      # routes on hot experts, the plan for one session's and the batch's
    step_context: int                   # the decode context the steps read at the position (a step per context)
    context: int

    @property
    def ratio(self) -> float:
        return self.sessions * self.steps[0] / self.steps[1]


def holdback(preset: str = VERDICT_PRESET, sessions: int = VERDICT_SESSIONS) -> Holdback:
    one, many = world(preset, 1), world(preset, sessions)
    at = predictions_position(one.build)

    def parts(w: World, B: int) -> tuple[float, float]:
        layers = np.array([w.cost.batched_split_layer(l, [at] * B) for l in range(len(w.cost.layers))])   # [L, 3]
        return float(layers[:, 0].sum()), float(sum(w.cost.overlap(g, c) for g, c in layers[:, 1:]))

    c, L = many.cost, range(len(many.cost.layers))
    (b1, e1), (bn, en) = parts(one, 1), parts(many, sessions)
    mean = lambda f: float(np.mean([f(l) for l in L]))   # noqa: E731
    return Holdback(sessions, (one.cost.batched_decode_step([at]), c.batched_decode_step([at] * sessions)),
                    (b1, bn), (e1, en),
                    (mean(lambda l: c.distinct(l, sessions, False)), mean(lambda l: c.routes(l, sessions, False))),
                    (mean(lambda l: sessions * c.distinct(l, 1, True)), mean(lambda l: c.distinct(l, sessions, True))),
                    sessions / c.batched_decode_step([at] * sessions, grouped_hot=True),
                    (one.cost.hot_share(), c.hot_share()), c.step_context(1, at), c.context)


def verdict(h: Holdback, preset: str = VERDICT_PRESET) -> str:
    head = (f"On `{preset}` Ostinato's modeled aggregate at {h.sessions} sessions is **{h.ratio:.2f}x** one "
            f"session's: {'at least' if h.ratio >= 2 else 'short of'} 2x.")
    grow = {"the dense parts before the experts (the sessions' attention)": h.before[1] - h.before[0],
            "the expert sides": h.experts[1] - h.experts[0]}
    (big, a), (_, b) = sorted(grow.items(), key=lambda kv: -kv[1])
    hidden = (", the host's side being the longer" if h.grouped_aggregate <= 1.001 * h.sessions / h.steps[1] else "")
    which = (f"The two grow about equally ({1e3 * a:.1f} and {1e3 * b:.1f} ms)" if b >= 0.9 * a else
             f"Most of the growth is in {big} ({1e3 * a:.1f} ms against {1e3 * b:.1f})")
    ms = lambda x: f"{1e3 * x:.1f}"   # noqa: E731
    parts = [
        head,
        f" A step of {h.sessions} takes {ms(h.steps[1])} ms against {ms(h.steps[0])} ms for one.",
        f" The layers' dense parts before their experts grow from {ms(h.before[0])} to {ms(h.before[1])} ms: their "
        "weights are read once, but each session's attention and indexer read its own rows, those of the "
        f"{h.step_context:,d}-token decode step that holds its position (of the plan's {h.context:,d}) "
        f"({ms((h.before[1] - h.before[0]) / (h.sessions - 1))} ms more a session).",
        f" The expert sides grow from {ms(h.experts[0])} to {ms(h.experts[1])} ms: the plan for {h.sessions} sessions "
        f"keeps {h.hot_share[1]:.1%} of routes on hot experts against {h.hot_share[0]:.1%} for one (each session's "
        "KV cache, snapshots and step state take GPU memory from the hot experts), "
        f"{h.sessions} tokens' cold routes touch {h.cold[0]:.2f} distinct cold experts a layer for {h.cold[1]:.2f} "
        "routes (the sessions seldom share a cold expert, and the host task reads each), and each hot route reads "
        f"its expert ({h.hot[0]:.1f} reads a layer for {h.hot[1]:.1f} distinct hot experts; a hot kernel grouping "
        f"the step's routes by expert would give {h.grouped_aggregate:.1f} tok/s{hidden}).",
        f" {which}.",
    ]
    return "".join(parts)


def table(rows: list[tuple[str, str, list[Cell]]]) -> str:
    out = ["| preset | system | 1 session | 2 sessions | 4 sessions | 8 sessions | 4 vs 1 |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for preset, name, cs in rows:
        shown = [f"{c.aggregate:.1f} ({c.per_session:.1f})" + (f" [{c.running} run]" if c.running < c.sessions else "")
                 for c in cs]
        four = next(c for c in cs if c.sessions == 4).aggregate / cs[0].aggregate
        out.append(f"| {preset} | {name} | " + " | ".join(shown) + f" | {four:.2f}x |")
    return "\n".join(out)


def render() -> str:
    rows = [(preset, *cells(preset, s)) for preset in PRESETS for s in SYSTEMS]
    at = predictions_position(world(PRESETS[0], 1).build)
    kernels = world(PRESETS[0], 1).kernels
    spec = world(PRESETS[0], 1).build.hardware
    dispatch = _kt(world(PRESETS[0], 2)).cost.dispatch_time(2)
    if any(world(p, 2).build.hardware.host.op_dispatch_s != spec.host.op_dispatch_s for p in PRESETS):
        raise ValueError("the presets' host.op_dispatch_s differ: the lead text states one")
    lead = (f"**Modeled, not measured.** Aggregate decode tok/s (per-session tok/s in brackets) when 1, 2, 4 or 8 "
            f"sessions decode at once, every session {at:,d} tokens into its conversation (the plans' headline "
            f"position), DeepSeek-V4-Flash sizes, routing by the cost model's expectation over the synthetic profile "
            f"(`{PROFILE}`), CPU expert kernels at "
            + ("each system's measured per-core rates (the simulator's kernel table, bench/simulator/kernels.py)"
               if kernels is not None
               else f"{OURS}'s rates for all")
            + ". Each system runs on the plan compiled for the sessions it holds (`--sessions N`: their KV caches "
            "and Ostinato's step states take GPU memory from the hot experts; the baselines get the same GPU memory "
            "for theirs). Ostinato: one fixed-shape step per batch size and decode context, a graph per GPU, "
            "reading the rows of the smallest context that holds the furthest session (runtime/engine/"
            "batch_runner.py). KTransformers as its DeepSeek-V4-Flash recipe serves: 2 "
            "requests at a time with a graph for batch 1 only, so two decode in an eager forward, priced at its op "
            f"dispatch like its prefill ({UNFUSED_EAGER_OPS_PER_LAYER} ops a layer x "
            f"{1e6 * spec.host.op_dispatch_s:.0f} us, both estimates: {1e3 * dispatch:.0f} ms a step on both "
            "presets), or as its first recipe did, 4 with graphs for 1, 2 and 4; sessions past the limit wait "
            "(`[n run]`). llama.cpp: `llama-server --parallel N`, every slot's token in one batch. "
            "`python -m ostinato.bench.parallel_model` prints it.")
    ours = next(cs for preset, name, cs in rows if preset == VERDICT_PRESET and name == "Ostinato")
    return lead + "\n\n" + table(rows) + "\n\n" + verdict(holdback()) + peak(ours)


def peak(cs: list[Cell], preset: str = VERDICT_PRESET) -> str:
    """A sentence when Ostinato's aggregate stops growing before the most sessions (else nothing)."""
    best = max(cs, key=lambda c: c.aggregate)
    if best is cs[-1]:
        return ""
    last = cs[-1]
    return (f" Past {best.sessions} sessions the aggregate falls ({best.aggregate:.1f} tok/s, then "
            f"{last.aggregate:.1f} at {last.sessions}): the plan for {last.sessions} keeps "
            f"{world(preset, last.sessions).cost.hot_share():.1%} of routes on hot experts.")


def doc_with(doc: str, block: str) -> str:
    """The document with this tool's block replaced by `block` (at its end, under its heading, when it has none)."""
    return session_restore.doc_with(doc, block, DOC_BEGIN, DOC_END, DOC_HEADING)


def shown(doc: str) -> str | None:
    """What the document holds between this tool's markers (None: no block)."""
    i, j = doc.find(DOC_BEGIN), doc.find(DOC_END)
    return None if i < 0 or j < i else doc[i + len(DOC_BEGIN):j].strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ostinato.bench.parallel_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--doc", nargs="?", const=DOC, type=Path, metavar="FILE",
                   help=f"write the block into FILE (default {DOC.relative_to(ROOT)}) between its markers")
    a = p.parse_args(argv)
    if a.doc is not None and not a.doc.is_file():
        p.error(f"--doc {a.doc}: no such file")
    block = render()
    if a.doc is None:
        print(f"{DOC_BEGIN}\n\n{block}\n\n{DOC_END}")
        return 0
    a.doc.write_text(doc_with(a.doc.read_text(), block))
    print(f"wrote the parallel sessions block in {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
