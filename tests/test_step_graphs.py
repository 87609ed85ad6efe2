"""The fixed-shape steps' graphs around their failures, checked on the CPU:
- capture runs when the engine loads, every step once, not on the first request;
- capture is all or nothing, and after it a GPU segment without its graph is an error, never a silent
  eager run;
- a step whose work never finishes (a hung host task) raises after the watchdog's deadline;
- the host waits for a step whose logits it reads, never for rollback's save and restore passes;
- a cold host task's failure is reported by the step it happened in, once;
- the executor times asynchronous GPU work by events on the device, not by the host's clock around
  the launch.
"""

from types import SimpleNamespace

import pytest
import torch
from engine_helpers import IDS, _variant

from ostinato.buckets import decode_contexts
from ostinato.runtime.engine import decode_graphs, step_runner, watchdog
from ostinato.runtime.engine.counters import Counters
from ostinato.runtime.engine.decode_graphs import SegmentGraphs
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.span_timer import SpanTimer
from ostinato.runtime.model.static_decode.rollback import RollbackPass


class FakeStep:
    """A step of `n` segments on `device` whose segment `fail` raises when run."""

    def __init__(self, n: int, device: str = "cpu", fail: int | None = None):
        self.segments = [SimpleNamespace(device=torch.device(device)) for _ in range(n)]
        self.tokens, self.fail, self.ran = 1, fail, []
        self.logits = torch.zeros(4)

    def rewind(self): pass
    def check_room(self, n=1): pass
    def hand_off(self, i): pass
    def note_step(self): pass

    def run_segment(self, i):
        if i == self.fail:
            raise RuntimeError("out of memory")
        self.ran.append(i)


def test_a_failed_capture_keeps_no_graph_and_says_where():
    graphs = SegmentGraphs(FakeStep(3, fail=1))
    with pytest.raises(RuntimeError, match="1-token step's CUDA graphs failed at segment 1 .*out of memory"):
        graphs.capture()
    assert not graphs.captured and not graphs.graphs


def test_a_gpu_segment_without_its_graph_is_an_error_after_capture():
    step = FakeStep(2, device="cuda:0")
    graphs = SegmentGraphs(step)
    graphs.done = True  # a capture that ran to its end, yet segment 0 has no graph
    with pytest.raises(RuntimeError, match="segment 0 on cuda:0 has no CUDA graph"):
        graphs.run()
    assert step.ran == []


def test_cpu_segments_run_eagerly_with_or_without_capture():
    step = FakeStep(2)
    graphs = SegmentGraphs(step)
    graphs.run()
    assert step.ran == [0, 1]
    graphs.capture()
    assert graphs.captured and not graphs.graphs  # CPU segments: nothing to capture
    step.ran.clear()
    graphs.run()
    assert step.ran == [0, 1]


def test_the_watchdog_raises_on_a_step_that_never_ends(monkeypatch):
    never = SimpleNamespace(query=lambda: False)
    with pytest.raises(TimeoutError, match="the 1-token step has not finished after 0 s"):
        watchdog.wait_done(never, 0.05, "the 1-token step")
    calls = iter([False, False, True])
    watchdog.wait_done(SimpleNamespace(query=lambda: next(calls)), 5.0, "a step")  # finishes: returns


class FakeStreams:
    """engine/streams.py's face for a GPU that is not here: records return a marker, nothing waits."""

    def current(self, device):
        return f"current {device}"

    def record(self, stream):
        return SimpleNamespace(query=lambda: True, stream=stream)


def test_the_host_waits_for_a_steps_logits_never_for_a_rollback_pass(monkeypatch):
    """A verify step's logits are read at once: its run waits (the watchdog). Rollback's save and restore
    hand the host nothing, and the next step runs after them on the same streams: their runs return without
    waiting (two waits of a step's length each per verify, before)."""
    waits = []
    monkeypatch.setattr(decode_graphs, "streams_for", lambda device: FakeStreams())
    monkeypatch.setattr(watchdog, "wait_done", lambda event, timeout_s, what: waits.append((event.stream, what)))
    saved = []
    gpu = [SimpleNamespace(device=torch.device("cuda", 0)), SimpleNamespace(device=torch.device("cuda", 1))]
    rollback = SimpleNamespace(segments=gpu, tokens=2, save_segment=saved.append, restore_segment=saved.append)
    for restore in (False, True):
        SegmentGraphs(RollbackPass(rollback, restore)).run()  # not captured: each segment eagerly
    assert saved == [0, 1, 0, 1] and waits == []
    step = FakeStep(2, device="cuda:1")
    SegmentGraphs(step).run()
    assert step.ran == [0, 1] and waits == [("current cuda:1", "the 1-token step")]


class FakeEvent:
    """A CUDA event the device reached at `at` ms."""

    def __init__(self, at: float):
        self.at = at

    def synchronize(self): pass

    def elapsed_time(self, end) -> float:
        return end.at - self.at


def test_spans_on_a_gpu_are_timed_by_device_events_settled_when_read():
    counters = Counters()
    device_ms = iter([0.0, 7.0, 10.0, 12.5])  # the device's times at each record: 7 ms, then 2.5 ms of work
    timer = SpanTimer(counters, event=lambda device: FakeEvent(next(device_ms)))
    with timer.span("hot_s", torch.device("cuda", 1)):
        pass  # the launch returns at once; the host's clock would say ~0
    with timer.span("upload_s", torch.device("cuda", 1)):
        pass
    assert counters.hot_s == 0 and len(timer.pending) == 2  # nothing waited for until read
    timer.settle()
    assert counters.hot_s == pytest.approx(7e-3) and counters.upload_s == pytest.approx(2.5e-3)
    assert not timer.pending


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_the_engine_captures_every_step_at_load_not_on_the_first_request(compiled, tiny_ckpt, monkeypatch):
    captured = []
    monkeypatch.setattr(step_runner, "on_gpu", lambda step: True)  # the capture path, run on the CPU
    monkeypatch.setattr(decode_graphs.SegmentGraphs, "capture",
                        lambda self, real=decode_graphs.SegmentGraphs.capture: (captured.append(self.step.tokens),
                                                                                 real(self))[-1])
    plan, _ = compiled
    plan = _variant(plan, "mixed", None)
    plan = plan.replace(policy=plan.policy.replace(prefill_buckets=[2, 4]))
    engine = load_engine(plan, tiny_ckpt, device="cpu")
    try:
        # at load: the decode step and the 2-token step once per decode context, the larger bucket once
        contexts = len(decode_contexts(plan.policy.context))
        assert contexts > 1 and sorted(captured) == [1] * contexts + [2] * contexts + [4]
        session = engine.new_session()
        session.prefill(IDS[:4], last_only=True)
        session.decode(int(IDS[4]))
        assert len(captured) == 2 * contexts + 1  # not again
    finally:
        engine.close()


@pytest.mark.slow  # the compiled plan's engine (C++ kernels)
def test_a_cold_task_failure_is_reported_once_by_its_step(compiled, tiny_ckpt):
    plan, _ = compiled
    plan = _variant(plan, "mixed", None).replace(policy=plan.policy.replace(prefill_buckets=[2]))
    engine = load_engine(plan, tiny_ckpt, device="cpu")
    try:
        bridge = next(b for b in engine.executor.bridges if b is not None)
        bridge.task(2).status = -7  # the 2-token step's task rejected an expert id
        with pytest.raises(ValueError, match="2-token step: an expert id is out of range"):
            bridge.check()
        bridge.check()  # the 1-token steps after it succeed: no stale failure
        session = engine.new_session()
        session.prefill(IDS[:3], last_only=True)
        session.decode(int(IDS[3]))
    finally:
        engine.close()
