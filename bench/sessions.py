"""Session benchmark: Ostinato against its baselines, MODELED on the paper's workstation (the cost model
+ sampled routing) and MEASURED here (the real engine on the CPU, tiny model, plan variants).

    python -m ostinato.bench.sessions [--sessions FILE] [--per-workload N] [--skip-measured] [--p90-only] [--doc [FILE]]

--sessions: any workload CSV (plans/workloads/README.md; default: the shipped agent_turns.csv); its
sessions are grouped by workload (the shipped sources as coding / customer service, any other source
by its name).

The headline states each comparison twice: with every system's CPU kernel at its measured rates (the tables)
and with every system at the cost model's own kernel (equal kernels, `--kernels none`), so the share of an edge
that is the kernel's shows. Its rows with hypothetical variants (KTransformers with a prefix cache its DeepSeek-V4
recipe lacks) are apart from the rows of baselines that exist. Every table names the weights each system is
priced with.

Under the tables, the p90 verdict (issue #57): Ostinato's turns around its 90th-percentile wait, each wait split
into the cost model's priced terms for it and for KTransformers at its best with a prefix cache at the same turns
(simulator/wait_terms.py), and the sentences that name the largest term.

Writes build/bench/{modeled.md, p90_verdict.md, measured.md, *.png}. Ratios only compare systems within one run.
--doc rewrites the modeled tables, the headline and the re-placement lines in docs/benchmarks.md (or FILE) and the
plot beside it, and the p90 verdict's block of the workload file replayed (its markers are added under the tables'
block when the page has none). --p90-only prints (and with --doc writes) the p90 verdict alone (about a minute).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from ostinato.bench.simulator.bench import (
    DOC_END,
    DOC_SESSIONS,
    EDGE_BEGIN,
    EDGE_END,
    HEADLINE_BEGIN,
    HEADLINE_END,
    REPLACE_BEGIN,
    REPLACE_END,
    REPLACE_README_BEGIN,
    REPLACE_README_END,
    by_workload,
    doc_with,
    modeled_tables,
    run_modeled,
)
from ostinato.bench.simulator.kernels import KERNEL_TABLES
from ostinato.bench.simulator.ktransformers import WITH_PREFIX_CACHE
from ostinato.bench.simulator.trace import TraceSampler
from ostinato.bench.simulator.wait_terms import BAND, breakdown, verdict_table
from ostinato.bench.simulator.world import build_world
from ostinato.plans import plans_dir
from ostinato.workload import WorkloadError, read_sessions

SHIPPED = plans_dir() / "workloads" / "agent_turns.csv"
AGENT_SCALE = plans_dir() / "workloads" / "agent_scale.csv"  # drawn from published traffic (bench/agent_workload.py)
AGENT_BEGIN = ("<!-- modeled tables (agent_scale): written by python -m ostinato.bench.sessions --sessions "
               "plans/workloads/agent_scale.csv --skip-measured --doc; do not edit -->")
AGENT_END = "<!-- end of the modeled tables (agent_scale) -->"
# The p90 verdict's block per workload file (its stem), right under that file's tables.
P90_BEGIN = "<!-- p90 verdict ({}): written by python -m ostinato.bench.sessions --doc; do not edit -->"
P90_END = "<!-- end of the p90 verdict ({}) -->"
DOC = Path("docs/benchmarks.md")  # --doc's default: the page that shows the modeled tables (from the repository root)
PLOT = "modeled-wait-vs-coverage.png"  # the plot that page shows, written beside it


def at_equal_kernels(world):
    """The same plan with every system at the cost model's own CPU kernel (`--kernels none`), for the headline's
    equal-kernels column; None where `world` is that already."""
    return build_world(kernels=None, build=world.build) if world.kernels is not None else None


def agent_scale_block(world, sessions) -> str:
    """docs/benchmarks.md's agent-scale block: the headline rows, then the systems' and ablation tables."""
    tables, head, _ = modeled_tables(world, sessions, DOC_SESSIONS, seed=0, equal=at_equal_kernels(world))
    return head + "\n\n" + tables


def p90_verdict(world, sessions, per_workload: int = DOC_SESSIONS, seed: int = 0) -> str:
    """The p90 verdict (module docstring): per workload of `sessions` (at most `per_workload` each, as the tables),
    the terms of Ostinato's p90-band waits against KTransformers at its best with a prefix cache (hypothetical: the
    headline's best baseline on these rows) at the same turns, replayed on the tables' routing (`seed`)."""
    systems = world.policies("best")
    ours, theirs = systems[0], next(p for p in systems if p.name == WITH_PREFIX_CACHE)
    k = world.build.config.num_experts_per_tok
    found = [breakdown(w, ss, ours, theirs, TraceSampler(world.shares, k, seed))
             for w, ss in by_workload(sessions, per_workload).items()]
    return (f"Each wait of Ostinato's turns between its p{BAND[0]:.0f} and p{BAND[1]:.0f} wait (the turns after each "
            "session's first), split into the cost model's priced terms summed over layers, following each overlap "
            f"to the side that sets it so that the terms add up to the wait; {theirs.name} at the same turns. "
            "Means over those turns:\n\n" + verdict_table(found, theirs.name))


def doc_with_verdict(doc: str, block: str, label: str, under: str) -> str:
    """The page with its p90 verdict block of `label` (a workload file's stem) replaced; a page without one gets it
    right after the line `under` (the end marker of that file's tables)."""
    begin, end = P90_BEGIN.format(label), P90_END.format(label)
    if begin not in doc and end not in doc:
        i = doc.index(under) + len(under)
        return doc[:i] + f"\n\n{begin}\n\n{block}\n\n{end}" + doc[i:]
    return doc_with(doc, block, begin, end)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("build/bench"))
    p.add_argument("--sessions", type=Path, default=SHIPPED,
                   help="workload CSV to replay (default: the shipped agent sessions)")
    p.add_argument("--per-workload", type=int, default=DOC_SESSIONS,
                   help="sessions per workload in the modeled tables (6)")
    p.add_argument("--sweep-sessions", type=int, default=2, help="sessions per workload in the coverage sweep (2)")
    p.add_argument("--coverages", default="0.5,0.6,0.7,0.8,0.84,0.9,0.95")
    p.add_argument("--kernels", default=str(KERNEL_TABLES),
                   help="each system's measured CPU kernel times: a folder of per-ISA tables (default: the shipped "
                        "side-by-side runs; the box's ISA's is used), one table file, or 'none' to price every "
                        "system at Ostinato's kernel speed")
    p.add_argument("--skip-measured", action="store_true")
    p.add_argument("--p90-only", action="store_true",
                   help="only the p90 verdict (with --doc: only its block); not the tables it explains")
    p.add_argument("--doc", type=Path, nargs="?", const=DOC, metavar="FILE",
                   help=f"rewrite the modeled tables between their markers in FILE (default {DOC}) and its plot "
                        "beside it (only with the shipped sessions, the default --per-workload, --seed and --kernels)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        sessions = read_sessions(a.sessions)
    except WorkloadError as e:
        p.error(f"--sessions {e}")
    if not sessions:
        p.error(f"--sessions {a.sessions}: no sessions in the file")
    kernels = None if a.kernels == "none" else Path(a.kernels)
    if kernels is not None and not kernels.exists():
        p.error(f"--kernels {kernels}: no such file or folder")
    if a.doc and (a.sessions.resolve() not in (SHIPPED.resolve(), AGENT_SCALE.resolve())
                  or a.per_workload != DOC_SESSIONS or a.seed != 0
                  or kernels is None or kernels.resolve() != KERNEL_TABLES.resolve()):
        p.error("--doc: the documented tables are those of the shipped sessions or the agent-scale ones with the "
                "default --per-workload, --seed and --kernels")
    if a.doc and not a.doc.is_file():
        p.error(f"--doc {a.doc}: no such file (run from the repository root, or name the file)")
    t0 = time.perf_counter()
    world = build_world(kernels=kernels)
    for note in world.kernels.notes if world.kernels is not None else ():
        print(f"CPU kernel table: {note}", file=sys.stderr)
    if a.p90_only:
        verdict = p90_verdict(world, sessions, a.per_workload, a.seed)
        print(verdict)
        if a.doc:
            shipped = a.sessions.resolve() == SHIPPED.resolve()
            label, under = (SHIPPED.stem, DOC_END) if shipped else (AGENT_SCALE.stem, AGENT_END)
            a.doc.write_text(doc_with_verdict(a.doc.read_text(), verdict, label, under))
            print(f"(rewrote the p90 verdict ({label}) in {a.doc}: {time.perf_counter() - t0:.0f} s)")
        return 0
    if a.doc and a.sessions.resolve() == AGENT_SCALE.resolve():  # its block: the systems' tables and headline
        block, verdict = agent_scale_block(world, sessions), p90_verdict(world, sessions, a.per_workload, a.seed)
        doc = doc_with(a.doc.read_text(), block, AGENT_BEGIN, AGENT_END)
        a.doc.write_text(doc_with_verdict(doc, verdict, AGENT_SCALE.stem, AGENT_END))
        print(f"{block}\n\n{verdict}\n(rewrote the agent-scale tables and p90 verdict in {a.doc}: "
              f"{time.perf_counter() - t0:.0f} s)")
        return 0
    print(f"MODELED on {world.build.hardware.name} with DeepSeek-V4-Flash sizes; routing: synthetic profile "
          f"({world.build.profile.source}); plan hot share {world.build.cost.hot_share():.1%}, "
          f"upload threshold {world.build.threshold} tokens; llama.cpp layer placement: {world.gpu_layers} of "
          f"{len(world.build.cost.layers)} layers on the GPUs")
    report = run_modeled(world, sessions, a.out, a.per_workload, a.sweep_sessions,
                         tuple(float(c) for c in a.coverages.split(",")), max_generated=64, seed=a.seed,
                         equal=at_equal_kernels(world))
    print(report)
    verdict = p90_verdict(world, sessions, a.per_workload, a.seed)
    (a.out / "p90_verdict.md").write_text(verdict + "\n")
    print(f"\n{verdict}")
    if a.doc:
        edge = (a.out / "edge_vs_coverage.md").read_text().strip()
        replaced = (a.out / "replacement.md").read_text().strip()
        head = (a.out / "headline.md").read_text().strip()
        lines = (a.out / "replacement_readme.md").read_text().strip()
        doc = doc_with(doc_with(a.doc.read_text(), report), edge, EDGE_BEGIN, EDGE_END)
        doc = doc_with(doc_with(doc, replaced, REPLACE_BEGIN, REPLACE_END), head, HEADLINE_BEGIN, HEADLINE_END)
        doc = doc_with(doc, lines, REPLACE_README_BEGIN, REPLACE_README_END)
        a.doc.write_text(doc_with_verdict(doc, verdict, SHIPPED.stem, DOC_END))
        plot = a.doc.resolve().parent / PLOT
        shutil.copyfile(a.out / "modeled_wait_vs_coverage.png", plot)
        print(f"(rewrote the modeled tables in {a.doc} and its plot {plot})")
    print(f"(modeled half: {time.perf_counter() - t0:.0f} s; plots: {a.out}/modeled_wait_vs_coverage.png, "
          f"{a.out}/modeled_session_timeline.png)")
    if not a.skip_measured:
        from .measured_sessions import run_measured  # noqa: PLC0415  (builds models: only when asked)
        print(run_measured(sessions, a.out, a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
