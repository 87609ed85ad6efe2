"""The executor's counters as callers read them (runtime/engine/counters.py: LiveCounters).

A caller keeps the view it got once and takes deltas across work (`before = c.copy()`, work,
`c.minus(before)`): the server's per-request accounting and ostinato-run's replay table do exactly that.
Routes of fixed-shape steps (bucket prefills, decode steps) are held and counted in batches, and GPU span
times are settled late, so every read must settle them first, or the delta misses them.
"""

import torch
from engine_helpers import IDS, _variant

from ostinato.runtime.engine.counters import Counters, LiveCounters
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.route_tally import RouteTally
from ostinato.runtime.engine.span_timer import SpanTimer


def test_a_kept_view_sees_a_bucket_prefill_and_decode_steps(compiled, tiny_ckpt):
    plan, _ = compiled
    plan = _variant(plan, "mixed", None)
    plan = plan.replace(policy=plan.policy.replace(prefill_buckets=[2, 4, 8, 16, 32]))
    engine = load_engine(plan, tiny_ckpt, device="cpu")
    L, k = plan.model.layers, plan.model.top_k
    counters = engine.executor.counters  # read once, kept, as the server's worker and replay do
    before = counters.copy()
    session = engine.new_session()
    token = int(session.prefill(IDS[:20], last_only=True)[-1].argmax())  # 20 = 16 + 4: two bucket steps
    for _ in range(10):
        token = int(session.decode(token).argmax())
    delta = counters.minus(before)
    assert delta.routes == (20 + 10) * k * L
    assert delta.forwards == (2 + 10) * L
    assert delta.routes_hot > 0 and delta.routes_cold > 0  # the mixed placement: both sides counted
    assert delta.decode_step_s > 0
    assert delta == engine.executor.counters.minus(before)  # reading through a fresh view: the same
    engine.close()


class FakeEvent:
    def __init__(self, ms: float):
        self.ms = ms

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end) -> float:
        return end.ms - self.ms


def test_every_read_of_the_view_settles_held_steps_and_pending_spans():
    totals = Counters()
    hot_of = torch.tensor([[True, False, False, False]])
    tally, clock = RouteTally(hot_of), iter(range(0, 100, 5))
    timer = SpanTimer(totals, event=lambda device: FakeEvent(float(next(clock))))

    def settle():
        tally.flush(totals)
        timer.settle()

    view = LiveCounters(totals, settle)
    before = view.copy()
    tally.add(0, torch.tensor([[0, 1, 2, 2]]), totals)  # one held step: 1 hot route, 3 cold, 2 distinct cold
    with timer.span("hot_s", torch.device("cuda")):     # a GPU span: 5 ms between its fake events
        pass
    assert totals.routes == 0 and totals.hot_s == 0     # still pending
    delta = view.minus(before)
    assert (delta.forwards, delta.routes_hot, delta.routes_cold, delta.distinct_cold) == (1, 1, 3, 2)
    assert abs(delta.hot_s - 5e-3) < 1e-12
    tally.add(0, torch.tensor([[0, 0, 0, 3]]), totals)
    assert view.routes_hot == 4 and view.hot_share == 4 / 8  # fields and properties read settled too
