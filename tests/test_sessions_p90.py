"""python -m ostinato.bench.sessions writes the p90 verdict (#57) under its tables: its own block per workload file,
added under the tables' block of a page without one and rewritten in place after."""

from __future__ import annotations

import pytest

from ostinato.bench import sessions as bench_sessions
from ostinato.bench.simulator import wait_terms as wt
from ostinato.bench.simulator.bench import DOC_BEGIN, DOC_END
from ostinato.workload import SessionShape, Turn


@pytest.fixture(scope="module")
def world():
    """The V4-Flash plan on rtx4090d-x4 (build_world), built once for the module's tests: it is read only (each
    replay makes its own policies)."""
    from ostinato.bench.simulator.world import build_world
    return build_world()


def test_the_verdict_block_goes_under_the_tables_once_and_is_rewritten_in_place():
    page = f"# page\n\n{DOC_BEGIN}\n\ntables\n\n{DOC_END}\n\n## next section\n"
    once = bench_sessions.doc_with_verdict(page, "first verdict", "agent_turns", DOC_END)
    begin, end = bench_sessions.P90_BEGIN.format("agent_turns"), bench_sessions.P90_END.format("agent_turns")
    assert once.index(DOC_END) < once.index(begin) < once.index("first verdict") < once.index(end) < \
        once.index("## next section")
    twice = bench_sessions.doc_with_verdict(once, "second verdict", "agent_turns", DOC_END)
    assert "first verdict" not in twice and twice.count(begin) == 1 and "second verdict" in twice
    other = bench_sessions.doc_with_verdict(twice, "scale verdict", "agent_scale", DOC_END)
    assert "second verdict" in other and "scale verdict" in other   # one block per workload file
    with pytest.raises(ValueError):
        bench_sessions.doc_with_verdict(f"{begin}\nno end", "x", "agent_turns", DOC_END)


@pytest.mark.slow
def test_the_verdict_of_a_small_workload_states_every_workload_and_the_goal(world):
    """The V4-Flash plan on rtx4090d-x4, two workloads of two sessions: a table row per term paid and a sentence
    per workload naming the largest term and whether the p90 goal is met."""
    sessions = [SessionShape(f"{src}/s{i}", (Turn(3000, 20), Turn(120, 30), Turn(900, 10), Turn(400, 5)))
                for src in ("mini-swe-agent/x", "tau2-bench/y") for i in range(2)]
    text = bench_sessions.p90_verdict(world, sessions, per_workload=2)
    for workload in ("coding", "customer service"):
        assert f"| {workload} | **the wait** (" in text
        assert f"**{workload}**: p90 wait " in text and "(goal 0.8x: " in text
        assert "the largest term of the difference is " in text
    assert f"| coding | {wt.COLD} |" in text   # the 900-token turns upload, the baseline's layerwise too


@pytest.mark.slow
@pytest.mark.parametrize("workloads", [bench_sessions.SHIPPED, bench_sessions.AGENT_SCALE])
def test_the_documented_p90_verdicts_are_the_tools_output(workloads, world):
    """docs/benchmarks.md's p90 verdict of each documented workload file, regenerated from the committed inputs."""
    from pathlib import Path

    from ostinato.workload import read_sessions
    doc = (Path(__file__).resolve().parents[1] / bench_sessions.DOC).read_text()
    begin, end = bench_sessions.P90_BEGIN.format(workloads.stem), bench_sessions.P90_END.format(workloads.stem)
    assert begin in doc, f"docs/benchmarks.md has no p90 verdict of {workloads.name}: run its --doc"
    shown = doc[doc.index(begin) + len(begin):doc.index(end)].strip()
    assert shown == bench_sessions.p90_verdict(world, read_sessions(workloads)), (
        f"docs/benchmarks.md's p90 verdict of {workloads.name} is stale: run python -m ostinato.bench.sessions "
        f"--sessions plans/workloads/{workloads.name} --skip-measured --doc")
