"""The modeled half of the session benchmark: tables per workload, wait vs coverage, one timeline.

Everything here is MODELED: the cost model of a hardware spec fed with sampled routing traces.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ostinato.workload import SessionShape

from .ktransformers import is_hypothetical
from .ostinato_policy import is_ostinato
from .replacement import IDLE_S, replacement_policies, study
from .replacement import tables as replacement_text
from .replay import simulate, simulate_groups, summarize
from .trace import TraceSampler, at_coverage
from .world import World

WORKLOADS = {"coding": "mini-swe-agent/", "customer service": "tau2-bench/"}
# docs/benchmarks.md's modeled tables sit between these lines (python -m ostinato.bench.sessions --doc rewrites
# them; tests/test_bench_sessions.py regenerates them from the committed inputs and fails on a difference).
DOC_BEGIN = "<!-- modeled tables: written by python -m ostinato.bench.sessions --doc; do not edit -->"
DOC_END = "<!-- end of the modeled tables -->"
# The edge-vs-coverage table (from the coverage sweep, like the plot) has a block of its own.
# The headline (docs/benchmarks.md): Ostinato against the best baseline per workload and configuration.
HEADLINE_BEGIN = "<!-- headline: written by python -m ostinato.bench.sessions --doc; do not edit -->"
HEADLINE_END = "<!-- end of the headline -->"
EDGE_BEGIN = "<!-- edge vs coverage: written by python -m ostinato.bench.sessions --doc; do not edit -->"
EDGE_END = "<!-- end of the edge vs coverage table -->"
# Re-placement during tool time (issue #31): its tables and its summary lines, both in docs/benchmarks.md.
REPLACE_BEGIN = "<!-- re-placement tables: written by python -m ostinato.bench.sessions --doc; do not edit -->"
REPLACE_END = "<!-- end of the re-placement tables -->"
REPLACE_README_BEGIN = "<!-- re-placement: written by python -m ostinato.bench.sessions --doc; do not edit -->"
REPLACE_README_END = "<!-- end of the re-placement lines -->"
DOC_SESSIONS = 6  # sessions per workload the doc's tables replay (the default of --per-workload)
PAPER_COVERAGE = 0.84


def table(title: str, runs: dict, weights: dict[str, str] | None = None) -> str:
    """One system per row; `weights`: the weight format each system is priced with, as a last column."""
    base = summarize(next(iter(runs.values())))  # the first system: Ostinato
    w_head, w_rule = (" weights priced |", "---|") if weights else ("", "")
    rows = [f"#### {title} (modeled)", "",
            "| system | median wait s | p90 wait s | decode tok/s | median session s | wait / Ostinato | "
            f"session / Ostinato | decode / Ostinato |{w_head}", f"|---|---|---|---|---|---|---|---|{w_rule}"]
    for name, r in runs.items():
        s = summarize(r)
        rows.append(f"| {name} | {s.median_wait_s:.3f} | {s.p90_wait_s:.3f} | {s.decode_tokens_per_s:.1f} | "
                    f"{s.median_session_s:.1f} | {s.median_wait_s / base.median_wait_s:.2f}x | "
                    f"{s.median_session_s / base.median_session_s:.2f}x | "
                    f"{s.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x |"
                    + (f" {weights[name]} |" if weights else ""))
    return "\n".join(rows)


def weights_of(world: World, config: str) -> dict[str, str]:
    """system -> the weight format it is priced with: a baseline's own (formats.py, its `weights`), else the
    plan's (Ostinato and its variants)."""
    plan = f"the plan's (dense {world.build.policy.dense_format}, experts MXFP4)"
    return {p.name: getattr(p, "weights", None) or plan for p in world.policies(config)}


def workload_of(session: SessionShape) -> str:
    """The shipped sources by their kind of agent, any other by its source's first path part."""
    return next((w for w, p in WORKLOADS.items() if session.name.startswith(p)), session.name.split("/")[0])


def by_workload(sessions: list[SessionShape], limit: int | None) -> dict[str, list[SessionShape]]:
    """Sessions grouped by workload (in the order they first appear), at most `limit` per workload."""
    groups: dict[str, list[SessionShape]] = {}
    for s in sessions:
        group = groups.setdefault(workload_of(s), [])
        if limit is None or len(group) < limit:
            group.append(s)
    return groups


CONFIG_TITLES = {"best": "baselines at their best", "documented": "baselines as documented"}


def modeled_tables(world: World, sessions: list[SessionShape], limit: int | None, seed: int = 0,
                   equal: World | None = None) -> tuple[str, str, tuple[str, dict]]:
    """Per workload the systems' tables (baselines at their best, then as documented) and the ablation
    table (markdown); the headline (Ostinato against the best baseline of each configuration: among the baselines
    that exist, then with the hypothetical variants too; with `equal`, the same world with every system at the
    cost model's own CPU kernel, the median waits at equal kernels beside); one session's runs for the timeline
    plot. Deterministic from the seed: docs/benchmarks.md embeds this text (doc_with)."""
    text, ablated, lines, timeline = [], [], [], None
    for w, ss in by_workload(sessions, limit).items():
        configs, runs = workload_runs(world, ss, seed, equal)
        ablated.append(table(f"ablation, {w}: {len(ss)} sessions, Ostinato with one mechanism removed", runs))
        for config, title in CONFIG_TITLES.items():
            runs = configs[config]
            text.append(table(f"{w}: {len(ss)} sessions, {world.build.hardware.name}, {title}", runs,
                              weights_of(world, config)))
            same = config_runs(equal, config, ss, seed) if equal is not None else None
            lines.append(headline_row(w, title, runs, best_baseline(runs, hypothetical=False), same))
            if any(is_hypothetical(n) for n in runs):
                lines.append(headline_row(w, f"{title} {WITH_HYPOTHETICAL}", runs,
                                          best_baseline(runs, hypothetical=True), same))
            timeline = timeline or (ss[0].name, runs)
    text += ablated   # the ablation tables after every workload's system tables
    equal_head, equal_rule = ((" median wait s at equal kernels (`--kernels none`): Ostinato / it |", "---|")
                              if equal is not None else ("", ""))
    head = ["| workload | baselines | best baseline (least median wait) | median wait s: Ostinato / it | "
            "p90 wait s: Ostinato / it | decode tok/s: Ostinato / it | median session s: Ostinato / it |" + equal_head,
            "|---|---|---|---|---|---|---|" + equal_rule] + lines
    return "\n\n".join(text), "\n".join(head), timeline


_RUNS: dict[tuple, dict] = {}   # config_runs' memo: README's validation replays the same sessions
_REPLACED: dict[tuple, tuple] = {}   # workload_runs' re-placement runs without drift (replacement_tables)


def _runs_key(world: World, config: str, sessions: list[SessionShape], seed: int) -> tuple:
    kernels = None if world.kernels is None else (world.kernels.source, tuple(
        (n, r.tokens, r.per_core, r.reserved_cores) for n, r in sorted(world.kernels.systems.items())))
    return (world.build.hardware.sha256, world.build.profile.source, world.build.config.num_experts_per_tok,
            kernels, config, tuple(s.name for s in sessions), seed)


def config_runs(world: World, config: str, sessions: list[SessionShape], seed: int) -> dict:
    """simulate() of `config`'s systems on `sessions`, remembered per world, configuration, sessions and
    seed for the life of the process (the validation table and the session tables share them)."""
    key = _runs_key(world, config, sessions, seed)
    if key not in _RUNS:
        k = world.build.config.num_experts_per_tok
        _RUNS[key] = simulate(sessions, world.policies(config), TraceSampler(world.shares, k, seed))
    return _RUNS[key]


def workload_runs(world: World, sessions: list[SessionShape], seed: int, equal: World | None = None
                  ) -> tuple[dict[str, dict], dict]:
    """config_runs() of every configuration (remembered there too) and simulate() of the ablations, from one
    replay of the sessions (simulate_groups: the same runs as one simulate() each, the trace drawn once).
    `equal` (modeled_tables' world at equal kernels): its configurations ride on the same replay when it routes
    alike (the same shares and routes per token: then config_runs() of it would draw this very trace, which does
    not depend on the systems that run) and are remembered for config_runs() too."""
    k = world.build.config.num_experts_per_tok
    routes_alike = equal is not None and equal.build.config.num_experts_per_tok == k and np.array_equal(
        equal.shares, world.shares)
    worlds = [world] + ([equal] if routes_alike else [])
    todo = [(w, c) for w in worlds for c in CONFIG_TITLES if _runs_key(w, c, sessions, seed) not in _RUNS]
    replacing = replacement_policies(world)   # re-placement without drift rides on this replay's trace
    *runs, ablated, replaced = simulate_groups(
        sessions, [w.policies(c) for w, c in todo] + [world.ablations(), replacing],
        TraceSampler(world.shares, k, seed), idle_s=IDLE_S)   # idle_s: only re-placing systems use it
    for (w, config), r in zip(todo, runs):
        _RUNS[_runs_key(w, config, sessions, seed)] = r
    _REPLACED[_runs_key(world, "replacement", sessions, seed)] = (replaced, list(replacing[0].moves))
    return {c: config_runs(world, c, sessions, seed) for c in CONFIG_TITLES}, ablated


def replacement_tables(world: World, sessions: list[SessionShape], limit: int | None, seed: int = 0
                       ) -> tuple[str, str]:
    """The re-placement tables and summary lines (both in docs/benchmarks.md) of replacement.py's study: drift as
    published and none, per workload; the no-drift runs from modeled_tables' replay when it ran first."""
    groups = by_workload(sessions, limit)
    known = {w: _REPLACED[key] for w, ss in groups.items()
             if (key := _runs_key(world, "replacement", ss, seed)) in _REPLACED}
    return replacement_text(study(world, groups, seed, known=known), world.build.hardware.name)


WITH_HYPOTHETICAL = "+ hypothetical variants"   # the headline row whose best baseline may be a hypothetical one


def best_baseline(runs: dict, hypothetical: bool) -> str:
    """The baseline with the least median wait: Ostinato's own variants (Ostinato + MTP) are not baselines, and
    variants with features their recipe lacks (is_hypothetical) count only when `hypothetical`."""
    waits = {n: summarize(r).median_wait_s for n, r in runs.items()
             if not is_ostinato(n) and (hypothetical or not is_hypothetical(n))}
    return min(waits, key=waits.get)


def headline_row(workload: str, title: str, runs: dict, best: str, equal_runs: dict | None = None) -> str:
    """One headline line: Ostinato (the first system) against the baseline `best`; with `equal_runs` (the same
    systems at equal CPU kernels) the two median waits there too."""
    sums = {n: summarize(r) for n, r in runs.items()}
    o, b = sums[next(iter(sums))], sums[best]

    def pair(x: float, y: float, f: str) -> str:
        return f"{x:{f}} / {y:{f}} ({x / y:.2f}x)"
    equal = ""
    if equal_runs is not None:
        eo, eb = summarize(next(iter(equal_runs.values()))), summarize(equal_runs[best])
        equal = f" {pair(eo.median_wait_s, eb.median_wait_s, '.3f')} |"
    return (f"| {workload} | {title.removeprefix('baselines ')} | {best} | "
            f"{pair(o.median_wait_s, b.median_wait_s, '.3f')} | {pair(o.p90_wait_s, b.p90_wait_s, '.3f')} | "
            f"{pair(o.decode_tokens_per_s, b.decode_tokens_per_s, '.1f')} | "
            f"{pair(o.median_session_s, b.median_session_s, '.0f')} |" + equal)


def edge_table(sweep: dict) -> str:
    """The best baseline's median wait over Ostinato's at each hot-set coverage of the sweep."""
    rows = ["| hot-set coverage of routes | Ostinato median wait s | best baseline | its median wait s | "
            "edge (its wait / Ostinato's) |", "|---|---|---|---|---|"]
    names = [n for n in sweep if not n.startswith("_")]
    ours, others = names[0], [n for n in names[1:] if not is_ostinato(n) and not is_hypothetical(n)]
    for i, cov in enumerate(sweep["_coverages"]):
        best = min(others, key=lambda n: sweep[n][i])
        rows.append(f"| {cov:.0%} | {sweep[ours][i]:.3f} | {best} | {sweep[best][i]:.3f} | "
                    f"{sweep[best][i] / sweep[ours][i]:.2f}x |")
    return "\n".join(rows)


def doc_with(doc: str, tables: str, begin: str = DOC_BEGIN, end: str = DOC_END) -> str:
    """The document's text with its block between `begin` and `end` replaced by `tables`."""
    i, j = doc.find(begin), doc.find(end)
    if i < 0 or j < i:
        raise ValueError(f"the document has no '{begin}' ... '{end}' block")
    return doc[:i + len(begin)] + "\n\n" + tables + "\n\n" + doc[j:]


def run_modeled(world: World, sessions: list[SessionShape], out: Path, limit: int | None, sweep_sessions: int,
                coverages: tuple[float, ...], max_generated: int | None, seed: int = 0,
                equal: World | None = None) -> str:
    """`equal`: the same world at equal CPU kernels, for the headline's column beside (modeled_tables)."""
    out.mkdir(parents=True, exist_ok=True)
    report, head, timeline = modeled_tables(world, sessions, limit, seed, equal)
    replaced, replaced_lines = replacement_tables(world, sessions, limit, seed)
    (out / "replacement.md").write_text(replaced + "\n")
    (out / "replacement_readme.md").write_text(replaced_lines + "\n")
    sweep = coverage_sweep(world, by_workload(sessions, sweep_sessions), coverages, max_generated, seed)
    plot_sweep(sweep, out / "modeled_wait_vs_coverage.png", world.build.hardware.name)
    plot_timeline(*timeline, out / "modeled_session_timeline.png")
    (out / "modeled.md").write_text(report + "\n")
    (out / "edge_vs_coverage.md").write_text(edge_table(sweep) + "\n")
    (out / "headline.md").write_text(head + "\n")
    return report


def coverage_sweep(world: World, groups: dict, coverages, max_generated, seed) -> dict[str, list[float]]:
    """Median wait per system with synthetic traces whose hot-set coverage is each of `coverages`."""
    from ostinato.workload import shrink_sessions
    ss = shrink_sessions([s for g in groups.values() for s in g], max_generated=max_generated)
    out: dict[str, list[float]] = {}
    for cov in coverages:
        shares = at_coverage(world.shares, world.hot, cov)
        runs = simulate(ss, world.policies(), TraceSampler(shares, world.build.config.num_experts_per_tok, seed))
        for name, r in runs.items():
            out.setdefault(name, []).append(summarize(r).median_wait_s)
    out["_coverages"] = list(coverages)
    return out


def plot_sweep(sweep: dict, path: Path, hw: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    cov = sweep["_coverages"]
    for name, waits in sweep.items():
        if not name.startswith("_"):
            ax.plot(cov, waits, marker="o", label=name)
    ax.axvline(PAPER_COVERAGE, color="grey", ls="--", label="paper's 84% coverage")
    ax.set(xlabel="hot-set coverage of routes (synthetic traces)", ylabel="median wait after tool output (s)",
           title=f"MODELED: wait vs coverage, {hw}", yscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_timeline(name: str, runs: dict, path: Path) -> None:
    """Per system, the session as a bar of prefill (dark) and decode (light) segments over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 3 + 0.3 * len(runs)))
    for y, r in enumerate(runs.values()):
        t = 0.0
        for turn in next(s for s in r if s.name == name).turns:
            ax.broken_barh([(t, turn.prefill.seconds)], (y - 0.35, 0.7), color="tab:red")
            t += turn.prefill.seconds
            ax.broken_barh([(t, turn.decode.seconds)], (y - 0.35, 0.7), color="tab:blue", alpha=0.35)
            t += turn.decode.seconds
    ax.set_yticks(range(len(runs)), list(runs))
    ax.set(xlabel="seconds (engine time only; tool time not included)",
           title=f"MODELED: one session's timeline, {name.split('/')[-1]}\nred: prefill (the wait after each "
                 "tool output), blue: decode")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
