"""The agent-scale workload (bench/agent_workload.py -> plans/workloads/agent_scale.csv): drawn from TraceLab's
published statistics, committed as generated, and read with its idle times."""

import math

import pytest

from ostinato.bench import agent_workload as w
from ostinato.bench.simulator.bench import doc_with
from ostinato.workload import WorkloadError, read_sessions


def test_the_committed_file_and_its_statistics_are_the_generators():
    text = w.render()
    assert w.OUT.read_text() == text, "regenerate: python -m ostinato.bench.agent_workload --doc"
    doc = w.DOC.read_text()
    assert doc_with(doc, w.statistics_table(text), w.DOC_BEGIN, w.DOC_END) == doc, "regenerate with --doc"


def test_the_generators_distributions_have_the_published_statistics():
    d = w.Draws(seed=11)
    appended = sorted(d.appended() for _ in range(200_000))
    assert abs(appended[len(appended) // 2] / w.MEDIAN_APPENDED - 1) < 0.02
    assert abs(sum(a < 1000 for a in appended) / len(appended) - w.SHARE_UNDER_1K) < 0.005
    assert abs(sum(a for a in appended if a >= w.TAIL_MIN) / sum(appended) - w.TAIL_TOKEN_SHARE) < 0.03
    for (mu, sigma), p50, p90 in ((d.tool, w.TOOL_P50_S, w.TOOL_P90_S), (d.human, w.HUMAN_P50_S, w.HUMAN_P90_S)):
        assert math.exp(mu) == pytest.approx(p50) and math.exp(mu + w.Z90 * sigma) == pytest.approx(p90)
    outputs = sorted(d.output() for _ in range(20_001))
    assert abs(outputs[10_000] - w.MEDIAN_OUTPUT) <= 3
    steps = [d.steps() for _ in range(50_000)]
    assert abs(sum(steps) / len(steps) / w.STEPS_PER_SESSION - 1) < 0.03


def test_sessions_stay_within_the_context_and_compact_past_it():
    for session in read_sessions(w.OUT):
        assert sum(t.appended + t.generated for t in session.turns) <= w.CONTEXT_CAP
        assert all(t.idle_before_s >= 0 for t in session.turns)
        assert session.turns[0].idle_before_s == 0 or not session.name.endswith(".0")  # an agent's first call
    rows = w.OUT.read_text().splitlines()
    assert any(",compacted," in r for r in rows)
    assert abs(w.median_prefix(w.sessions(w.solve_initial_median())) / w.MEDIAN_PREFIX - 1) < 0.01


def test_a_bad_idle_time_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("source,session,turn,appended_tokens,generated_tokens,idle_before_s\n"
                    "s,a,0,10,2,0\ns,a,1,5,2,soon\n")
    with pytest.raises(WorkloadError, match=r"w.csv:3: idle_before_s must be a non-negative number"):
        read_sessions(path)
