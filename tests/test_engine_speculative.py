"""MTP speculative decoding in the engine (issue #30): the MTP block placed like a layer (its experts hot,
cold or mixed), drafts verified in one 2-token step (the static step, or the dynamic model), a rejected
draft undone exactly. Greedy tokens equal plain decoding's over every placement and decode mode, across
the tiny model's window and compressor boundaries (sliding 16, CSA 4, HCA 128) and two turns."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import _variant, caches_equal
from graph_safety import first_difference, graph_safe_trace, segment_owners

from ostinato.plan import LayerPlan, PlanError
from ostinato.runtime.engine.greedy import greedy_tokens
from ostinato.runtime.engine.loader import load_engine

PROMPT = torch.randint(0, 1000, (100,), generator=torch.Generator().manual_seed(11)).tolist()
TURN2 = torch.randint(0, 1000, (20,), generator=torch.Generator().manual_seed(12)).tolist()
N = 36  # 100 + 36 crosses the first HCA window (128)


def speculative_plan(plan, placement: str, mtp_hot: str):
    """`plan` with its layers placed by `placement` (engine_helpers) and the MTP block's experts all hot,
    all cold or half, speculation on."""
    plan = _variant(plan, placement, None)
    E = plan.model.routed_experts
    hot = {"all-hot": list(range(E)), "all-cold": [], "mixed": list(range(0, E, 2))}[mtp_hot]
    mtp = LayerPlan(layer=plan.model.layers, gpu=plan.layers[-1].gpu, attention="sliding", hot_experts=hot,
                    hot_route_share=0.0)
    return plan.replace(mtp=mtp, policy=plan.policy.replace(speculative="mtp"))


def engine(compiled, tiny_ckpt, placement="mixed", mtp_hot="mixed", **kw):
    return load_engine(speculative_plan(compiled[0], placement, mtp_hot), tiny_ckpt, device="cpu", **kw)


def argmax(logits) -> int:
    return int(logits.reshape(-1).argmax())


def plain(es, prompt, n) -> list[int]:
    """Greedy plain decoding: n tokens after `prompt` on the engine session (the last is not run)."""
    gen = [argmax(es.prefill(prompt, last_only=True)[-1])]
    while len(gen) < n:
        gen.append(argmax(es.decode(gen[-1])))
    return gen


def speculative(es, prompt, n, choose=None) -> list[int]:
    """Greedy speculative decoding as the server runs it: `choose(index in gen, mtp logits)` is the draft
    (default: the MTP block's argmax)."""
    gen = [argmax(es.prefill(prompt, last_only=True)[-1])]
    while len(gen) < n:
        d_logits = es.draft(gen[-1])
        if d_logits is None or len(gen) == n - 1:
            gen.append(argmax(es.decode(gen[-1])))
            continue
        d = argmax(d_logits) if choose is None else choose(len(gen), d_logits)
        logits = es.verify(gen[-1], d)
        if argmax(logits[0]) == d:
            gen += [d, argmax(logits[1])]
        else:
            gen.append(argmax(es.reject()))
    return gen[:n]


def library(es, prompt, n) -> list[int]:
    """engine/greedy.py's loop (ostinato-run's), on the same prompt."""
    return greedy_tokens(es, argmax(es.prefill(prompt, last_only=True)[-1]), n)


def two_turns(es, run, **kw) -> list[int]:
    first = run(es, PROMPT, N, **kw)
    second = run(es, first[:-1] + TURN2, 12, **kw)  # the reply (its last token was never run) and the next turn
    return first + second


@pytest.fixture(scope="module")
def want(compiled, tiny_ckpt):
    e = load_engine(_variant(compiled[0], "mixed", None), tiny_ckpt, device="cpu")
    try:
        return two_turns(e.new_session(), plain)
    finally:
        e.close()


def oracle(want):
    return lambda i, logits: want[i]


def wrong(want):
    return lambda i, logits: (want[i] + 1) % 1000


SLOW = pytest.mark.slow


@pytest.mark.parametrize("placement,mtp_hot,static", [
    ("mixed", "mixed", True),
    pytest.param("all-cold", "all-cold", True, marks=SLOW),
    pytest.param("all-hot", "all-hot", True, marks=SLOW),
    pytest.param("mixed", "all-hot", False, marks=SLOW),
    ("all-cold", "mixed", False),
])
def test_greedy_tokens_equal_plain_decoding(compiled, tiny_ckpt, want, placement, mtp_hot, static):
    e = engine(compiled, tiny_ckpt, placement, mtp_hot, static_decode=static)
    try:
        es = e.new_session()
        assert two_turns(es, speculative) == want
        assert es.drafted > 0
        if placement == mtp_hot == "mixed":  # ostinato-run's loop too
            assert two_turns(e.new_session(), library) == want
    finally:
        e.close()


@pytest.mark.parametrize("static", [True, pytest.param(False, marks=SLOW)])
def test_forced_acceptance_and_rejection_give_the_same_tokens(compiled, tiny_ckpt, want, static):
    """A draft that proposes the known continuation is always kept, one that never does always rejected;
    the tokens are plain decoding's either way (both paths run whatever the random weights do)."""
    e = engine(compiled, tiny_ckpt, static_decode=static)
    try:
        es = e.new_session()
        assert speculative(es, PROMPT, N, oracle(want)) == want[:N]
        assert es.accepted == es.drafted > N // 3
        es = e.new_session()
        assert speculative(es, PROMPT, N, wrong(want)) == want[:N]
        assert es.accepted == 0 and es.drafted == N - 2  # every step but the last (one token left: plain)
    finally:
        e.close()


@pytest.mark.parametrize("static", [True, pytest.param(False, marks=SLOW)])
def test_a_rejected_draft_leaves_the_session_as_plain_decoding_does(compiled, tiny_ckpt, want, static):
    """Every draft rejected: after the same tokens, every tensor of the session's cache (the static
    buffers stored back, or the dynamic cache) equals plain decoding's bit for bit."""
    e = engine(compiled, tiny_ckpt, static_decode=static)
    try:
        ours, theirs = e.new_session(), e.new_session()
        assert speculative(ours, PROMPT, N, wrong(want)) == plain(theirs, PROMPT, N)
        a, b = ours.state(), theirs.state()
        assert a.tokens == b.tokens
        caches_equal(a.cache, b.cache)
    finally:
        e.close()


@SLOW
def test_truncate_and_fork_keep_decoding_exact(compiled, tiny_ckpt, want):
    """An edit below what the MTP block has run restarts its drafter; a fork drafts on its own copy."""
    e = engine(compiled, tiny_ckpt)
    try:
        es = e.new_session()
        first = speculative(es, PROMPT, N)
        other = es.fork()
        es.truncate(len(PROMPT) - 10)
        assert speculative(es, PROMPT[-10:], 8) == plain(e.new_session(), PROMPT, 8)
        assert speculative(other, first[:-1] + TURN2, 12) == want[N:]
    finally:
        e.close()


def test_speculation_needs_a_placed_mtp_block(compiled, tiny_ckpt):
    plan = _variant(compiled[0], "mixed", None).replace(mtp=None, policy=compiled[0].policy.replace(speculative="off"))
    with pytest.raises(PlanError, match="--speculative mtp: the plan places no MTP block"):
        load_engine(plan, tiny_ckpt, device="cpu", speculative="mtp")
    e = load_engine(speculative_plan(compiled[0], "mixed", "mixed"), tiny_ckpt, device="cpu", speculative="off")
    try:
        es = e.new_session()
        assert not e.speculative and es.draft(1) is None
        assert not e.model.weights.mtp  # the block is not even loaded
    finally:
        e.close()


@pytest.mark.parametrize("drafts", ["oracle", pytest.param("wrong", marks=SLOW)])
def test_fixed_shape_drafts_equal_the_dynamic_blocks(compiled, tiny_ckpt, want, drafts):
    """The MTP block's fixed-shape steps (2 pairs after a kept draft, 1 after a rejection) give the dynamic
    block's draft logits, step by step past its sliding window (16), within 1e-4 of their scale."""
    seen = {}
    for static in (True, False):
        e = engine(compiled, tiny_ckpt, static_decode=static)
        try:
            logged, pick = [], (oracle if drafts == "oracle" else wrong)(want)

            def choose(i, logits):
                logged.append(logits.clone())
                return pick(i, logits)
            speculative(e.new_session(), PROMPT, N, choose)
            assert static == bool(e.step_runner and e.step_runner.drafts)
            seen[static] = logged
        finally:
            e.close()
    assert len(seen[True]) == len(seen[False]) > 15
    for i, (a, b) in enumerate(zip(seen[True], seen[False])):
        scale = b.abs().max()
        assert (a - b).abs().max() <= 1e-4 * scale, f"draft {i}: {(a - b).abs().max()} at scale {scale}"


def test_the_verify_and_draft_steps_are_graph_safe(compiled, tiny_ckpt):
    """The 2-token verify step, its rollback (save and restore) and the MTP block's steps of 1 and 2 pairs,
    with the placement executor (hot launch, cold routes through the host task): no host reads, equal op
    traces at two positions."""
    e = engine(compiled, tiny_ckpt)
    try:
        es = e.new_session()
        es.prefill(PROMPT, last_only=True)
        runner = e.step_runner
        runner.bind(es.session)
        verify = runner.steps[2]
        traces = []
        for at in (0, 2):
            verify.set_tokens(PROMPT[at:at + 2])
            traces.append(graph_safe_trace(verify.run_segment, 0, owners=segment_owners(verify), segment=0))
            verify.note_step()
        assert traces[0] and first_difference(*traces) is None, first_difference(*traces)
        for fn in (runner.rollback.save_segment, runner.rollback.restore_segment):
            traces = []
            for _ in range(2):  # two positions
                traces.append(graph_safe_trace(fn, 0, owners=segment_owners(verify), segment=0))
                verify.state.positions[0].add_(1)
            assert traces[0] and first_difference(*traces) is None, (fn.__name__, first_difference(*traces))
        drafter = es.drafter
        for pairs, step in runner.drafts.items():
            runner.draft(drafter, torch.zeros(pairs, *step.streams.shape[1:]), torch.tensor(PROMPT[:pairs]))
            traces = []
            for _ in range(2):  # two positions
                traces.append(graph_safe_trace(step.run_segment, 0))
                step.note_step()
            assert traces[0] and first_difference(*traces) is None, (pairs, first_difference(*traces))
    finally:
        e.close()


@SLOW
def test_the_engine_captures_the_draft_steps_at_load(compiled, tiny_ckpt, want, monkeypatch):
    """The capture path, run on the CPU: the verify step and both MTP steps are captured with the others at
    load, and decoding through them stays exact."""
    from ostinato.runtime.engine import decode_graphs, step_runner

    captured = []
    monkeypatch.setattr(step_runner, "on_gpu", lambda step: True)
    monkeypatch.setattr(decode_graphs.SegmentGraphs, "capture",
                        lambda self, real=decode_graphs.SegmentGraphs.capture: (captured.append(
                            (type(self.step).__name__, self.step.tokens)), real(self))[-1])
    e = engine(compiled, tiny_ckpt)
    try:
        assert ("StaticStep", 2) in captured and {("StaticMtpStep", 1), ("StaticMtpStep", 2)} <= set(captured)
        n = len(captured)
        es = e.new_session()
        assert speculative(es, PROMPT, N) == want[:N]
        assert len(captured) == n
    finally:
        e.close()


@SLOW
def test_ostinato_run_speculates_as_asked_and_replies_the_same(compiled, tiny_ckpt, capsys):
    """--speculative mtp and off give the same greedy reply; mtp on a plan without the block is refused
    naming the flag and the field."""
    from ostinato.runtime.cli.run import main as run_main

    _, work = compiled
    plan = _variant(compiled[0], "mixed", None)
    speculative_plan(compiled[0], "mixed", "mixed").write(work / "with-mtp.yaml")
    plan.replace(mtp=None).write(work / "without-mtp.yaml")
    replies = []
    for choice in ("mtp", "off"):
        assert run_main([str(work / "with-mtp.yaml"), "--model", str(tiny_ckpt), "--device", "cpu", "--prompt",
                         "Hello", "--max-new", "12", "--speculative", choice]) == 0
        out = capsys.readouterr().out
        assert ("with MTP speculation" in out) == (choice == "mtp")
        replies.append(out.splitlines()[-1])
    assert replies[0] == replies[1] and replies[0].strip()
    assert run_main([str(work / "without-mtp.yaml"), "--model", str(tiny_ckpt), "--device", "cpu", "--prompt", "Hi",
                     "--speculative", "mtp"]) != 0
    err = capsys.readouterr().err
    assert "--speculative mtp: the plan places no MTP block (field 'mtp' is null" in err
