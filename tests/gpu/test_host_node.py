"""The decode step's cold-route bridge on the GPU: its host function (the CPU kernel launched by
cuLaunchHostFunc on a side stream forked from the capture stream) captured many times in one CUDA graph,
replayed: every task accepts its input, and a token with only hot routes gets zero cold sums."""

from __future__ import annotations

import pytest

from ostinato.bench.gpu_setup import all_hot_bridges, captured, sync

pytestmark = pytest.mark.gpu


def test_host_nodes_in_a_graph_replay(h200):
    engine = h200.engine(graphs=False)
    try:
        bridges = all_hot_bridges(engine, 32 if h200.cuda else 4)
        replay = captured(bridges.run, h200.device)
        for _ in range(3):
            replay()
        sync(h200.device)
        bridges.bridge.check()
        cold_sums = bridges.bridge.finish().float().cpu()
    finally:
        engine.close()
    assert cold_sums.shape == (1, bridges.hidden_size)
    assert not cold_sums.any()
