"""The engine's decode step on the GPU replayed from its CUDA graphs equals the same step run eagerly: the
tiny model compiled for one H200 in float32 (its dense format and compute dtype; at most 6 hot experts per
layer of 16), so cold routes cross to the CPU through the graphs' host nodes. Equal means the issue's
goal: to 1e-5 of the logit scale (logit_tolerance(float32)), where only the atomic adds' order differs."""

from __future__ import annotations

import pytest
import torch

from ostinato.bench.gpu_setup import logit_tolerance, rel_err

pytestmark = pytest.mark.gpu


def test_graph_decode_equals_eager_decode_across_cold_routes(h200, figure):
    prompt, steps = (100, 36) if h200.cuda else (24, 7)
    graph, eager = h200.engine(graphs=True, plan=h200.plan_f32), h200.engine(graphs=False, plan=h200.plan_f32)
    try:
        assert graph.model.dtype == torch.float32
        ids = torch.randint(0, graph.model.config.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0))
        sessions = [graph.new_session(), eager.new_session()]
        logits = [s.prefill(ids, last_only=True)[-1].float().cpu() for s in sessions]
        worst = 0.0
        for _ in range(steps):  # replayed from the graphs captured at load
            worst = max(worst, rel_err(logits[0], logits[1]))
            token = int(logits[1].argmax())
            logits = [s.decode(token).float().cpu() for s in sessions]
        counters = graph.executor.counters
    finally:
        graph.close()
        eager.close()
    figure("graph/eager_decode", worst)
    assert counters.routes_cold > 0, "no cold route crossed a host node: the check would prove nothing"
    assert worst <= logit_tolerance(torch.float32), f"graph vs eager logits differ by {worst:.1e} of the logit scale"
