"""Short prefills on the GPU as captured bucket steps (buckets 8..64 tokens) equal the same bucket steps run
eagerly: 16, 64 and 120 tokens after a 100-token prompt, on the tiny model compiled for one H200."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
BUCKETS, PROMPT = [8, 16, 32, 64], 100


@pytest.fixture(scope="module")
def engines(h200):
    """(graph, eager steps): the same bucketed plan, with and without its CUDA graphs."""
    plan = h200.plan.replace(policy=h200.plan.policy.replace(prefill_buckets=BUCKETS))
    graph, eager = h200.engine(graphs=True, plan=plan), h200.engine(graphs=False, plan=plan)
    yield graph, eager
    graph.close()
    eager.close()


@pytest.mark.parametrize("tokens", [16, 64, 120])
def test_bucket_graphs_equal_eager_bucket_steps(engines, tokens):
    graph, eager = engines
    vocab = graph.model.config.vocab_size
    ids = torch.randint(0, vocab, (PROMPT + tokens,), generator=torch.Generator().manual_seed(1))

    def last_logits(engine):
        s = engine.new_session()
        s.prefill(ids[:PROMPT], last_only=True)
        return s.prefill(ids[PROMPT:], last_only=True)[-1].float().cpu()

    want = last_logits(eager)
    for run in ("capture", "replay"):  # the graph engine's first run binds and captures, the next replays
        diff = ((last_logits(graph) - want).abs().max() / want.abs().max()).item()
        assert diff <= 1e-3, f"{run}: graph vs eager-step logits differ by {diff:.1e} of the logit scale"
