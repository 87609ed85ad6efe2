"""The plan's choices priced on workloads (compiler/compile.py, ostinato/adaptation.py idle_budget_s), the context
refusal against the model's positions, and the measured replay of agent-scale sessions (runtime/engine/replay.py:
a cached prefix, the recorded idle times)."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ostinato.adaptation import IDLE_S, idle_budget_s
from ostinato.compiler import compile as pipeline
from ostinato.compiler.compile import DEFAULT_WORKLOADS, CompileError, CompileOptions, compile_plan
from ostinato.plans import plans_dir
from ostinato.runtime.cli import run as run_cli
from ostinato.runtime.engine import replay as replay_module
from ostinato.workload import SessionShape, TokenSource, Turn, WorkloadError, read_sessions, shrink_sessions

FLASH_CONFIG = plans_dir() / "models" / "deepseek-v4-flash"
AGENT_TURNS, AGENT_SCALE = (plans_dir() / "workloads" / n for n in ("agent_turns.csv", "agent_scale.csv"))
COLUMNS = ("source", "model", "session", "turn", "appended_kind", "appended_tokens", "generated_tokens",
           "reasoning_tokens", "context_before", "idle_before_s")


def _flash(tmp_path, **options):
    """V4-Flash planned from its config.json alone on the 4090D box (about a second: no weights, no kernels)."""
    return compile_plan(CompileOptions(FLASH_CONFIG, tmp_path / "plan.yaml", "rtx4090d-x4", profile="synthetic:0.9",
                                       build_kernels=False, **options))


def _workload(path: Path, idle: list[float]) -> Path:
    """A one-session workload: a first call, then one call per idle period."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        context = 0
        for i, s in enumerate([0.0] + idle):
            w.writerow(["test", "m", "one", i, "initial" if i == 0 else "tool", 300, 20, 0, context, s])
            context += 320
    return path


# ----- the re-placement budget from recorded idle times -------------------------------------------
def test_the_budget_is_the_links_bytes_in_the_median_idle_period_the_workloads_record(tmp_path):
    plan = _flash(tmp_path, workloads=(_workload(tmp_path / "w.csv", [5.0, 2.0, 9.0, 2.0, 0.5]),)).plan
    h2d = plan.hardware.link.h2d_bandwidth
    assert plan.policy.adapt.max_bytes == int(h2d * 2.0)  # the median of 0.5, 2, 2, 5, 9
    assert plan.provenance.workloads == {"w.csv": hashlib.sha256((tmp_path / "w.csv").read_bytes()).hexdigest()}
    assert any("re-placement budget" in n and "w.csv" in n and "2 s" in n for n in plan.notes), plan.notes


def test_the_shipped_plan_choices_are_priced_on_both_shipped_workloads(tmp_path):
    b = _flash(tmp_path)
    plan = b.plan
    assert [w.name for w in b.workloads] == ["agent_turns.csv", "agent_scale.csv"]
    assert set(plan.provenance.workloads) == {"agent_turns.csv", "agent_scale.csv"}
    # agent_turns.csv records no idle time: the budget is agent_scale.csv's median idle period
    scale = [t.idle_before_s for s in read_sessions(AGENT_SCALE) for t in s.turns[1:]]
    idle = float(np.sort(scale)[(len(scale) - 1) // 2])
    assert plan.policy.adapt.max_bytes == int(plan.hardware.link.h2d_bandwidth * idle)
    assert idle < IDLE_S  # half of TraceLab's idle periods are shorter than the second the old default assumed
    said = "\n".join(plan.notes)
    assert "priced on agent_turns.csv and agent_scale.csv" in said  # threshold and buckets: the same at both
    for w in b.workloads:  # each workload's typical call, predicted
        assert f"workload {w.name} ({w.sessions} sessions, {len(w.appended):,d} calls" in said
        assert f"median cached prefix of {w.median_cached:,d}" in said


def test_without_workloads_the_budget_is_the_assumed_idle_second_and_the_plan_says_so(tmp_path):
    plan = _flash(tmp_path, workloads=()).plan
    assert plan.policy.adapt.max_bytes == int(plan.hardware.link.h2d_bandwidth * IDLE_S)
    assert plan.provenance.workloads == {}
    assert any("assumed (no workload records its idle times)" in n for n in plan.notes)
    only_turns = _flash(tmp_path, workloads=(AGENT_TURNS,)).plan  # it records no idle times either
    assert only_turns.policy.adapt.max_bytes == plan.policy.adapt.max_bytes


def test_each_workload_weighs_the_same_whatever_its_number_of_idle_periods():
    few, many, some = np.full(3, 10.0), np.full(97, 1.0), np.full(2, 5.0)
    # pooled, the 97 short periods would set the median at 1 s; weighed per workload, a third of it each: 5 s
    idle, why = idle_budget_s({"few.csv": few, "many.csv": many, "some.csv": some})
    assert idle == 5.0 and "the median of the 102 idle periods few.csv, many.csv and some.csv record" in why
    assert idle_budget_s({"few.csv": few[:2], "many.csv": many[:2]})[0] == 1.0  # the lower of the middle two
    assert idle_budget_s({"few.csv": few, "none.csv": np.array([])})[0] == 10.0
    assert idle_budget_s({})[0] == IDLE_S


def test_the_same_inputs_give_the_same_plan(tmp_path):
    a, b = _flash(tmp_path / "a").plan, _flash(tmp_path / "b").plan
    assert a.model_dump(mode="json") == b.model_dump(mode="json")


def test_two_workloads_of_one_file_name_are_refused(tmp_path):
    (tmp_path / "x").mkdir()
    other = shutil.copy(AGENT_TURNS, tmp_path / "x" / "agent_turns.csv")
    with pytest.raises(CompileError, match="another workload has the same file name"):
        _flash(tmp_path, workloads=(AGENT_TURNS, Path(other)))


# ----- threshold and buckets where the workloads' positions disagree ------------------------------
class _Priced:
    """A cost model whose split/upload crossover is `crossover`: upload-once costs half a split-route token
    past it, plus a fixed 100 (its first upload)."""

    def __init__(self, crossover: int):
        self.x = crossover

    def eager_prefill(self, n: int, threshold: int | None) -> float:
        return float(n) if threshold is None or n <= threshold else 100.0 + 0.5 * n


def _build(workloads: dict[str, list[int]], crossovers: dict[str, int]):
    b = pipeline.Build(options=None)
    for name, appends in workloads.items():
        b.workloads.append(SimpleNamespace(name=name, appended=np.array(appends), priced=_Priced(crossovers[name])))
    return b


def _threshold(b):
    return pipeline._least_wait(b, [(w.name, w.priced.x) for w in b.workloads],
                                lambda w, t, n: w.priced.eager_prefill(n, t), lambda t, n: t is None or n > t,
                                lambda: None)


def test_where_the_workloads_crossovers_differ_the_threshold_of_least_predicted_prefill_wins():
    # a's appends (150 tokens) split-route under b's crossover (400) at 150 a call, upload under a's own (100) at
    # 175; b's (300) split at 300, upload at 250. Mean over each: threshold 100 costs 175 + 250, 400 costs 150 + 300
    b = _build({"a.csv": [150, 150], "b.csv": [300]}, {"a.csv": 100, "b.csv": 400})
    value, source = _threshold(b)
    assert value == 100 and source == "a.csv (least predicted prefill of a.csv 100, b.csv 400)"
    # each workload weighs the same: ten times a's calls change nothing...
    b = _build({"a.csv": [150] * 20, "b.csv": [300]}, {"a.csv": 100, "b.csv": 400})
    assert _threshold(b)[0] == 100
    # ...nor outvote b: a's mean is 187 at 100 and 174 at 400, b's 295 and 390 (pooled, 400 would win:
    # 2,165 against 2,130)
    b = _build({"a.csv": [150] * 9 + [390], "b.csv": [390]}, {"a.csv": 100, "b.csv": 400})
    assert _threshold(b)[0] == 100
    # appends that split-route faster: b's crossover
    b = _build({"a.csv": [150], "b.csv": [180]}, {"a.csv": 100, "b.csv": 400})
    assert _threshold(b) == (400, "b.csv (least predicted prefill of a.csv 100, b.csv 400)")


def test_equal_choices_name_every_workload_and_ties_go_to_the_first():
    b = _build({"a.csv": [150], "b.csv": [300]}, {"a.csv": 200, "b.csv": 200})
    assert _threshold(b) == (200, "a.csv and b.csv")
    # no call between the crossovers: both cost the same, the first workload's wins
    b = _build({"a.csv": [50], "b.csv": [900]}, {"a.csv": 400, "b.csv": 100})
    assert _threshold(b)[0] == 400


# ----- the context against the model's positions --------------------------------------------------
def test_a_context_past_the_models_max_position_embeddings_is_refused_naming_both_and_the_option(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    config = json.loads((FLASH_CONFIG / "config.json").read_text())
    config["max_position_embeddings"] = 65536
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(CompileError) as e:
        compile_plan(CompileOptions(model, tmp_path / "plan.yaml", "rtx4090d-x4", context=131072, build_kernels=False))
    said = str(e.value)
    assert "--context 131,072" in said and "max_position_embeddings 65,536" in said and "config.json" in said
    assert compile_plan(CompileOptions(model, tmp_path / "plan.yaml", "rtx4090d-x4", context=65536,
                                       build_kernels=False)).plan.policy.context == 65536


# ----- workloads: positions, prefixes, idle ------------------------------------------------------
def test_the_cached_prefix_of_a_call_is_what_the_earlier_calls_left_in_the_cache():
    rows = list(csv.DictReader(open(AGENT_SCALE)))
    sessions = {s.name: s for s in read_sessions(AGENT_SCALE)}
    for r in rows[:400]:
        shape = sessions[f"{r['source']}/{r['session']}"]
        assert shape.cached_before(int(r["turn"])) == int(r["context_before"])
    # agent_turns.csv's context_before is the provider's prompt count: the cached prefix plus the call's append
    rows = list(csv.DictReader(open(AGENT_TURNS)))
    sessions = {s.name: s for s in read_sessions(AGENT_TURNS)}
    for r in rows[:400]:
        shape = sessions[f"{r['source']}/{r['session']}"]
        assert shape.cached_before(int(r["turn"])) == int(r["context_before"]) - int(r["appended_tokens"])


def test_a_session_from_a_later_call_carries_the_calls_before_as_its_prefix_and_shrinks_it_too():
    shape = SessionShape("s", (Turn(100, 10), Turn(50, 5, 2.0), Turn(20, 4, 0.5)))
    later = shape.starting_at(1)
    assert later.prefix == 110 and later.first == 1 and later.turns == shape.turns[1:]
    assert later.cached_before(1) == shape.cached_before(2) == 165
    small = shrink_sessions([later], scale=0.1, max_generated=2)[0]
    assert small.prefix == 11 and small.first == 1 and small.turns[0] == Turn(5, 2, 2.0)
    with pytest.raises(WorkloadError, match="no call 3 to start at"):
        shape.starting_at(3)


def test_ostinato_run_replays_an_agent_scale_session_from_a_call_at_its_recorded_position():
    a = run_cli.parse_args(["plan.yaml", "--session", str(AGENT_SCALE), "--session-index", "0", "--from-turn", "40",
                            "--limit-turns", "3", "--idle-scale", "0.01"])
    shape = run_cli.session_shape(a)
    row = next(r for r in csv.DictReader(open(AGENT_SCALE)) if r["session"] == "agent-00.0" and r["turn"] == "40")
    assert shape.prefix == int(row["context_before"]) > 60_000 and shape.first == 40 and len(shape.turns) == 3
    assert shape.turns[0].idle_before_s == float(row["idle_before_s"]) and a.idle_scale == 0.01
    with pytest.raises(SystemExit):
        run_cli.parse_args(["plan.yaml", "--session", str(AGENT_SCALE), "--idle-scale", "-1"])


# ----- the replay: a cached prefix, then each call after its idle time -----------------------------
class _Session:
    def __init__(self, prefilled: list[int]):
        self.prefilled, self.drafted, self.accepted, self.routes = prefilled, 0, 0, None

    def prefill_mode(self, n, last_only=False):
        return "split"

    def prefill(self, ids, last_only=False):
        self.prefilled.append(len(ids))
        return torch.zeros(1, 8)

    def decode(self, token):
        return torch.zeros(8)


class _Counters:
    def copy(self):
        return self

    def minus(self, other):
        return SimpleNamespace(hot_share=1.0, distinct_cold=0)


class _Engine:
    def __init__(self):
        self.prefilled: list[int] = []
        self.executor = SimpleNamespace(counters=_Counters())
        self.adapter = None
        self.plan = SimpleNamespace(predictions=SimpleNamespace(prefill=[]))

    def new_session(self):
        return _Session(self.prefilled)


def test_the_replay_prefills_the_prefix_once_then_sleeps_each_calls_idle_time_scaled(tmp_path, monkeypatch):
    monkeypatch.setattr(replay_module, "greedy_tokens", lambda session, first, n: [first] * max(n, 1))
    shape = SessionShape("s", (Turn(100, 10), Turn(50, 5, 2.0), Turn(20, 4, 0.5))).starting_at(1)
    engine, slept, told = _Engine(), [], []
    results = replay_module.replay(engine, shape, TokenSource(tmp_path, 8, 0), idle_scale=0.1, sleep=slept.append,
                                   on_prefix=lambda n, s: told.append(n))
    assert engine.prefilled == [109, 50, 20] and told == [110]  # the prefix's last token through the decode step
    assert slept == pytest.approx([0.2, 0.05])
    assert [r.turn for r in results] == [1, 2] and [r.idle_s for r in results] == pytest.approx([0.2, 0.05])
    slept.clear()
    replay_module.replay(engine, shape, TokenSource(tmp_path, 8, 0), idle_scale=0.0, sleep=slept.append)
    assert slept == []
    assert DEFAULT_WORKLOADS == (AGENT_TURNS, AGENT_SCALE)


def test_ostinato_compile_takes_workloads_by_default_the_shipped_ones_or_none(tmp_path):
    from ostinato.compiler.cli import compile as compile_cli

    base = ["model", "plan.yaml", "--hardware", "rtx4090d-x4"]
    assert compile_cli.parse_args(base)[0].workloads == (AGENT_TURNS, AGENT_SCALE)
    assert compile_cli.parse_args(base + ["--workload", "none"])[0].workloads == ()
    mine = _workload(tmp_path / "mine.csv", [1.0])
    assert compile_cli.parse_args(base + ["--workload", str(mine), "--workload", str(AGENT_SCALE)])[0].workloads == \
        (mine, AGENT_SCALE)
    with pytest.raises(SystemExit):
        compile_cli.parse_args(base + ["--workload", "none", "--workload", str(mine)])
