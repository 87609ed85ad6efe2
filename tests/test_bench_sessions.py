"""python -m ostinato.bench.sessions replays any workload CSV (--sessions FILE), grouped by workload,
with every system."""

from pathlib import Path

import pytest

from ostinato.bench import sessions as bench_sessions
from ostinato.bench.simulator.bench import by_workload
from ostinato.plans import plans_dir
from ostinato.workload import read_sessions

SYSTEMS = ("Ostinato", "Ostinato + MTP (90% acceptance)", "KTransformers (its DSV4 recipe)",
           "KTransformers + frequency GPU experts",
           "KTransformers + frequency GPU experts + prefix cache (hypothetical)",
           "llama.cpp layers", "llama.cpp CPU experts", "llama.cpp LRU cache")


@pytest.fixture(scope="module")
def world():
    """The documented tables' world (build_world: the V4-Flash plan compiled for rtx4090d-x4), built once for the
    module's tests: it is read only (each replay makes its own policies)."""
    from ostinato.bench.simulator.world import build_world
    return build_world()


def runs_waiting(wait: float) -> list:
    """One session's runs: a first turn, then a turn that waits `wait` s after its tool output."""
    from ostinato.bench.simulator.policy import Forward
    from ostinato.bench.simulator.replay import SessionTime, TurnTime
    first, second = TurnTime(8, 1, Forward(1.0), Forward(0.5), 1.0), TurnTime(8, 1, Forward(wait), Forward(0.5), wait)
    return [SessionTime("s", (first, second))]


def test_the_headline_picks_among_baselines_that_exist_and_states_equal_kernels_beside():
    """A hypothetical variant (a feature its recipe lacks) is a best baseline only in its own headline row; the
    equal-kernels column compares Ostinato with the same baseline at every system's kernel equal."""
    from ostinato.bench.simulator.bench import best_baseline, headline_row
    from ostinato.bench.simulator.ktransformers import BEST_DOCUMENTED, WITH_PREFIX_CACHE, is_hypothetical
    runs = {"Ostinato": runs_waiting(1.0), "Ostinato + MTP (90% acceptance)": runs_waiting(0.5),
            BEST_DOCUMENTED: runs_waiting(3.0), WITH_PREFIX_CACHE: runs_waiting(2.0),
            "llama.cpp LRU cache": runs_waiting(4.0)}
    assert is_hypothetical(WITH_PREFIX_CACHE) and not is_hypothetical(BEST_DOCUMENTED)
    assert best_baseline(runs, hypothetical=False) == BEST_DOCUMENTED
    assert best_baseline(runs, hypothetical=True) == WITH_PREFIX_CACHE
    equal = dict(runs, **{BEST_DOCUMENTED: runs_waiting(1.25)})   # its kernel at ours: most of the edge goes
    row = headline_row("coding", "baselines at their best", runs, BEST_DOCUMENTED, equal)
    assert row.startswith(f"| coding | at their best | {BEST_DOCUMENTED} | 1.000 / 3.000 (0.33x) |")
    assert row.endswith("| 1.000 / 1.250 (0.80x) |")


def test_ktransformers_runs_without_a_prefix_cache_unless_named_hypothetical():
    """Its DeepSeek-V4 recipe passes --disable-radix-cache: the policy's default, and the published rows'."""
    import inspect

    from ostinato.bench.published import SystemSpec
    from ostinato.bench.simulator.ktransformers import KTransformers
    assert inspect.signature(KTransformers).parameters["reuses_prefix"].default is False
    assert SystemSpec(name="KTransformers").reuses_prefix is False


def test_the_shipped_sessions_group_as_coding_and_customer_service():
    groups = by_workload(read_sessions(plans_dir() / "workloads" / "agent_turns.csv"), 3)
    assert list(groups) == ["coding", "customer service"] and all(len(g) == 3 for g in groups.values())


@pytest.mark.slow
def test_another_workload_file_is_replayed(tmp_path, capsys):
    csv = tmp_path / "mine.csv"
    rows = ["source,session,turn,appended_tokens,generated_tokens"]
    rows += [f"my-agents/helpdesk,s{s},{t},{[900, 40, 130][t]},{[30, 12, 50][t]}" for s in range(2) for t in range(3)]
    csv.write_text("\n".join(rows) + "\n")
    assert bench_sessions.main(["--sessions", str(csv), "--per-workload", "2", "--sweep-sessions", "1",
                                "--coverages", "0.8", "--skip-measured", "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "modeled.md").read_text()
    assert "#### my-agents: 2 sessions, rtx4090d-x4, baselines at their best" in report
    assert "#### my-agents: 2 sessions, rtx4090d-x4, baselines as documented" in report
    assert "| hot-set coverage of routes |" in (tmp_path / "out" / "edge_vs_coverage.md").read_text()
    assert "| my-agents | at their best |" in (tmp_path / "out" / "headline.md").read_text()
    assert "#### re-placement, my-agents: 2 sessions, rtx4090d-x4, session drift as published" in (
        tmp_path / "out" / "replacement.md").read_text()   # 3 turns only: no turn >= 3 to summarize (nan)
    for name in SYSTEMS:
        assert f"| {name} |" in report, name
    assert bench_sessions.main(["--sessions", str(csv), "--per-workload", "1", "--sweep-sessions", "1",
                                "--coverages", "0.8", "--skip-measured", "--kernels", "none",
                                "--out", str(tmp_path / "same")]) == 0
    same = (tmp_path / "same" / "modeled.md").read_text()  # every system at Ostinato's kernel speed
    assert "kt-kernel's measured rates" not in same and "kt-kernel's measured rates" in report
    with pytest.raises(SystemExit) as e:
        bench_sessions.main(["--sessions", str(tmp_path / "nope.csv"), "--skip-measured"])
    assert e.value.code == 2 and "nope.csv: sessions file not found" in capsys.readouterr().err


@pytest.mark.slow
def test_the_documented_tables_are_the_tools_output(world):
    """docs/benchmarks.md's modeled tables, regenerated from the committed plan inputs, workload and seed."""
    from ostinato.bench.simulator.bench import (
        DOC_BEGIN,
        DOC_END,
        DOC_SESSIONS,
        HEADLINE_BEGIN,
        HEADLINE_END,
        REPLACE_BEGIN,
        REPLACE_END,
        REPLACE_README_BEGIN,
        REPLACE_README_END,
        modeled_tables,
        replacement_tables,
    )

    doc = (Path(__file__).resolve().parents[1] / bench_sessions.DOC).read_text()
    block = doc[doc.index(DOC_BEGIN) + len(DOC_BEGIN):doc.index(DOC_END)].strip()
    sessions = read_sessions(bench_sessions.SHIPPED)
    tables, head, _ = modeled_tables(world, sessions, DOC_SESSIONS, seed=0,
                                     equal=bench_sessions.at_equal_kernels(world))
    assert block == tables, ("docs/benchmarks.md's modeled tables are stale: run "
                             "python -m ostinato.bench.sessions --skip-measured --doc")
    shown = doc[doc.index(HEADLINE_BEGIN) + len(HEADLINE_BEGIN):doc.index(HEADLINE_END)].strip()
    assert shown == head, ("docs/benchmarks.md's headline is stale: run python -m ostinato.bench.sessions "
                           "--skip-measured --doc")
    # re-placement during tool time (issue #31): its no-drift runs rode on modeled_tables' replay
    replaced, lines = replacement_tables(world, sessions, DOC_SESSIONS, seed=0)
    assert doc[doc.index(REPLACE_BEGIN) + len(REPLACE_BEGIN):doc.index(REPLACE_END)].strip() == replaced, (
        "docs/benchmarks.md's re-placement tables are stale: run python -m ostinato.bench.sessions "
        "--skip-measured --doc")
    shown = doc[doc.index(REPLACE_README_BEGIN) + len(REPLACE_README_BEGIN):doc.index(REPLACE_README_END)]
    assert shown.strip() == lines, "docs/benchmarks.md's re-placement lines are stale: run the same"


@pytest.mark.slow
def test_the_agent_scale_tables_are_the_tools_output_and_differ_as_the_page_says(world):
    """docs/benchmarks.md's agent-scale block, regenerated; and the direction its paragraph states: Ostinato's
    median wait below KTransformers' with a prefix cache (hypothetical: its DeepSeek-V4 recipe has none) on the
    shipped sessions, above it on the agent-scale ones."""
    from ostinato.bench.simulator.bench import WITH_HYPOTHETICAL
    from ostinato.bench.simulator.ktransformers import WITH_PREFIX_CACHE

    doc = (Path(__file__).resolve().parents[1] / bench_sessions.DOC).read_text()
    shown = doc[doc.index(bench_sessions.AGENT_BEGIN) + len(bench_sessions.AGENT_BEGIN):
                doc.index(bench_sessions.AGENT_END)].strip()
    block = bench_sessions.agent_scale_block(world, read_sessions(bench_sessions.AGENT_SCALE))
    assert shown == block, ("docs/benchmarks.md's agent-scale tables are stale: run python -m ostinato.bench.sessions "
                            "--sessions plans/workloads/agent_scale.csv --skip-measured --doc")

    def at_best_ratios(text: str) -> list[float]:  # the headline's rows with hypothetical variants: median wait,
        return [float(row.split("|")[4].split("(")[1].rstrip("x) ")) for row in text.splitlines()   # ours / theirs
                if f"| at their best {WITH_HYPOTHETICAL} | {WITH_PREFIX_CACHE} |" in row]

    assert at_best_ratios(block) and all(r > 1 for r in at_best_ratios(block))
    from ostinato.bench.simulator.bench import HEADLINE_BEGIN, HEADLINE_END

    shipped = doc[doc.index(HEADLINE_BEGIN):doc.index(HEADLINE_END)]
    assert at_best_ratios(shipped) and all(r < 1 for r in at_best_ratios(shipped))
