"""Speculative decoding and re-placement on the GPU, both on in one engine (the tiny model compiled for one H200
in float32 with policy.speculative mtp and adapt idle): the MTP block's draft step, the 2-token verify step and
the rollback of a rejected draft, replayed from their CUDA graphs; then a swap forced between two turns of the
session (the adapt stream copies each promoted expert into the slot its evicted one freed, and slot_of /
cold_of change between replays, under graphs captured at load). Its greedy tokens equal the same session's
on the eager engine (same plan, same swaps, no graphs) and plain decoding's (no speculation, no swaps).

The drafts are scripted so both verify outcomes happen whatever the random MTP block predicts: the plain
run's next token (kept) twice, then a wrong one (rejected and rolled back)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from ostinato.adaptation import AdaptPolicy

pytestmark = pytest.mark.gpu


def argmax(logits: torch.Tensor) -> int:
    return int(logits.reshape(-1).argmax())


@dataclass
class Run:
    tokens: list[int]
    kept: int = 0        # drafts the verify step kept
    rejected: int = 0    # drafts it rejected (rolled back)
    swapped: int = 0     # experts promoted by the forced re-placement
    hot: np.ndarray | None = None  # [L, E] the placement at the end


def forcing(plan):
    """The plan with a re-placement policy that swaps as soon as a session's routes favour a cold expert at all
    (prior 0: the session's counts alone; no minimum gain), at most two experts per layer."""
    policy = AdaptPolicy(mode="idle", max_experts=2 * plan.model.layers, max_bytes=10**12, decay=0.5, prior=0.0,
                         min_gain=0.0)
    return plan.replace(policy=plan.policy.replace(adapt=policy))


def turn(es, new: list[int], n: int, want: list[int] | None, run: Run, before_decode=lambda: None) -> list[int]:
    """Prefill `new`, then n greedy tokens: plainly (want None), else speculatively with scripted drafts."""
    gen = [argmax(es.prefill(new, last_only=True)[-1])]
    before_decode()
    while len(gen) < n:
        d_logits = es.draft(gen[-1]) if want is not None and len(gen) + 1 < n else None
        if d_logits is None:
            gen.append(argmax(es.decode(gen[-1])))
            continue
        i = len(gen)
        vocab = d_logits.reshape(-1).shape[0]
        draft = want[i] if (run.kept + run.rejected) % 3 < 2 else (want[i] + 1) % vocab
        logits = es.verify(gen[-1], draft)  # [2, V]
        if argmax(logits[0]) != draft:
            run.rejected += 1
            gen.append(argmax(es.reject()))
            continue
        run.kept += 1
        gen.append(draft)
        if len(gen) < n:
            gen.append(argmax(logits[1]))
    return gen[:n]


def session(engine, prompt: list[int], second: list[int], n: int, want: list[int] | None) -> Run:
    """Two turns of one session; between them (engine with an adapter) every cold expert is made the session's
    favourite, so the turn's end evicts and starts uploads, which land after the next prefill."""
    run, es = Run([]), engine.new_session()
    first = turn(es, prompt, n, want and want[:n], run)
    run.tokens += first
    if engine.adapter is not None:
        hot = engine.adapter.hot()
        es.routes.counts[:] = np.where(hot, 1.0, 100.0)  # [L, E] every cold expert outranks every hot one
    engine.end_turn(es)
    settle = (lambda: None) if engine.adapter is None else (lambda: engine.adapter.settle(wait=True))
    run.tokens += turn(es, (prompt + first)[len(es):] + second, n, want and want[n:], run, settle)
    if engine.adapter is not None:
        run.swapped, run.hot = engine.adapter.stats.swapped, engine.adapter.hot()
    return run


def test_speculation_and_replacement_keep_the_eager_tokens(h200):
    prompt_len, second_len, n = (100, 20, 24) if h200.cuda else (24, 6, 9)
    plan = forcing(h200.plan_spec)
    assert plan.policy.speculative == "mtp" and plan.mtp is not None
    vocab = h200.tiny.vocab_size
    g = torch.Generator().manual_seed(7)
    prompt, second = (torch.randint(0, vocab, (k,), generator=g).tolist() for k in (prompt_len, second_len))
    runs = {}
    for name, graphs, p in (("plain", False, h200.plan_f32), ("eager", False, plan), ("graph", True, plan)):
        engine = h200.engine(graphs=graphs, plan=p)
        try:
            planned = None if engine.adapter is None else engine.adapter.hot()
            runs[name] = session(engine, prompt, second, n, None if name == "plain" else runs["plain"].tokens)
        finally:
            engine.close()
    graph, eager, plain = runs["graph"], runs["eager"], runs["plain"]
    assert graph.rejected > 0 and graph.kept > 0, f"verify kept {graph.kept}, rejected {graph.rejected} drafts"
    assert graph.swapped > 0 and (graph.hot != planned).any(), "the forced re-placement swapped nothing"
    assert (graph.hot == eager.hot).all() and graph.swapped == eager.swapped
    assert graph.tokens == eager.tokens, f"graph {graph.tokens} != eager {eager.tokens}"
    assert graph.tokens == plain.tokens, f"speculative + re-placed {graph.tokens} != plain {plain.tokens}"
