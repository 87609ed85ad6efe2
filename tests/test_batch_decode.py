"""Several sessions decoding together (runtime/engine/batch_runner.py, static_decode/batch_step.py, the server's
--parallel N): every session's tokens are exactly its solo ones, whatever the batch size, the mix of sessions
or their moves between solo and batched steps; the plan bounds how many run at once."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import TOL, _variant

from ostinato.plan import PlanError
from ostinato.runtime.engine import decode_together
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.model.static_decode.batch_step import BatchStep
from ostinato.runtime.model.static_decode.step import StaticStep

STEPS = 12


def _prompts(n: int, seed: int) -> list[list[int]]:
    """n distinct prompts of different lengths (across the compressors' boundaries), fresh per seed."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 300, (n,), generator=g).tolist()
    return [torch.randint(2, 1024, (t,), generator=g).tolist() for t in lengths]


def _engine(compiled, tiny_ckpt, parallel: int, placement: str = "mixed"):
    plan = _variant(compiled[0], placement, None)
    plan = plan.replace(policy=plan.policy.replace(sessions=max(parallel, plan.policy.sessions)))
    return load_engine(plan, tiny_ckpt, device="cpu", parallel=parallel)


def _solo(engine, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and every step's logits of `prompt` decoded alone."""
    s = engine.new_session()
    logits = s.prefill(prompt, last_only=True)[-1]
    tokens, seen = [], []
    for _ in range(n):
        tokens.append(int(logits.argmax()))
        seen.append(logits)
        logits = s.decode(tokens[-1])
    return tokens, seen


@pytest.fixture(scope="module")
def engine4(compiled, tiny_ckpt):
    engine = _engine(compiled, tiny_ckpt, 4)
    yield engine
    engine.close()


@pytest.mark.parametrize("sessions", [2, 3, 4])
def test_each_session_decodes_its_solo_tokens_in_a_batch(engine4, sessions):
    prompts = _prompts(sessions, seed=sessions)
    solo = [_solo(engine4, p, STEPS) for p in prompts]
    ss = [engine4.new_session() for _ in prompts]
    logits = [s.prefill(p, last_only=True)[-1] for s, p in zip(ss, prompts)]
    tokens = [[] for _ in prompts]
    for step in range(STEPS):
        for b, row in enumerate(logits):
            want = solo[b][1][step]
            assert (row - want).abs().max() <= TOL * want.abs().max(), (b, step)
            tokens[b].append(int(row.argmax()))
        logits = decode_together(ss, [t[-1] for t in tokens])
    assert tokens == [t for t, _ in solo]
    assert all(len(s) == len(p) + STEPS for s, p in zip(ss, prompts))


class Greedy:
    """A session decoded greedily: the logits of its next pick, and the tokens picked."""

    def __init__(self, engine, prompt: list[int]):
        self.session = engine.new_session()
        self.logits = self.session.prefill(prompt, last_only=True)[-1]
        self.tokens: list[int] = []

    def pick(self) -> int:
        self.tokens.append(int(self.logits.argmax()))
        return self.tokens[-1]

    def alone(self) -> None:
        self.logits = self.session.decode(self.pick())

    def turn(self, ids: list[int]) -> None:
        """The agent's next turn (the last pick is not run: the turn's tokens follow instead)."""
        self.logits = self.session.prefill(ids, last_only=True)[-1]


def together(*runs: Greedy) -> None:
    rows = decode_together([r.session for r in runs], [r.pick() for r in runs])
    for r, row in zip(runs, rows):
        r.logits = row


def test_sessions_move_between_solo_and_batched_steps_exactly(engine4):
    """Sessions join and leave batches, decode alone between batched steps, take a new turn while others sit
    in batch slots and change slots: each still gets exactly the tokens it gets alone."""
    prompts, turn = _prompts(3, seed=11), [5, 6, 7, 8, 9]
    a, b, c = (Greedy(engine4, p) for p in prompts)
    for _ in range(4):
        together(a, b)          # a and b in slots 0 and 1
    for _ in range(3):
        b.alone()               # the solo step: b stored back from its slot
    for _ in range(3):
        together(c, b, a)       # new places: c in slot 0, b in 1, a in 2
    a.turn(turn)                # a prefills while b and c stay seated
    for _ in range(4):
        together(b, c, a)
    for _ in range(2):
        together(c, a)
    alone = [Greedy(engine4, p) for p in prompts]
    for run, counts in zip(alone, ((7, 6), (14,), (9,))):
        for i, n in enumerate(counts):
            if i:
                run.turn(turn)
            for _ in range(n):
                run.alone()
    assert [r.tokens for r in (a, b, c)] == [r.tokens for r in alone]
    for got, want in zip((a, b, c), alone):
        assert len(got.session) == len(want.session)
        assert (got.logits - want.logits).abs().max() <= TOL * want.logits.abs().max()


def test_a_batch_needs_the_plan_to_count_its_sessions(compiled, tiny_ckpt):
    plan = _variant(compiled[0], "mixed", None)
    with pytest.raises(PlanError, match=r"--sessions 2"):
        load_engine(plan.replace(policy=plan.policy.replace(sessions=1)), tiny_ckpt, device="cpu", parallel=2)
    with pytest.raises(PlanError, match="at least 1"):
        load_engine(plan, tiny_ckpt, device="cpu", parallel=0)


def test_a_batch_step_refuses_slots_it_cannot_run(engine4):
    runner = engine4.step_runner
    slot = StaticStep(engine4.model, runner.step.max_context)
    with pytest.raises(ValueError, match="each with its own state"):
        BatchStep([slot, slot])
    with pytest.raises(ValueError, match="T = 1"):
        BatchStep([StaticStep(engine4.model, runner.step.max_context, tokens=2)])
    with pytest.raises(ValueError, match="distinct sessions"):
        s = engine4.new_session()
        s.prefill([3, 4, 5])
        engine4.batcher.decode([s.session, s.session], [1, 2])


@pytest.mark.slow  # an engine of its own, its steps run through the capture path
def test_the_batch_steps_are_captured_at_load_and_stay_exact(compiled, tiny_ckpt, monkeypatch):
    """The capture path, run on the CPU (as a GPU engine runs it): the solo decode step of every decode context and
    every batch size's step at the smallest context are captured at load, a larger context's when a batch first
    reaches it, and decoding through the captured steps gives the solo tokens."""
    from ostinato.buckets import decode_contexts
    from ostinato.runtime.engine import decode_graphs, step_runner

    captured = []
    monkeypatch.setattr(step_runner, "on_gpu", lambda step: True)
    monkeypatch.setattr(decode_graphs.SegmentGraphs, "capture",
                        lambda self, real=decode_graphs.SegmentGraphs.capture: (captured.append(
                            (type(self.step).__name__, self.step.tokens, self.step.context)), real(self))[-1])
    engine = _engine(compiled, tiny_ckpt, 3)
    try:
        contexts = decode_contexts(engine.plan.policy.context)
        assert len(contexts) > 1 and {("StaticStep", 1, c) for c in contexts} <= set(captured)
        assert {("BatchStep", 2, contexts[0]), ("BatchStep", 3, contexts[0])} <= set(captured)
        n = len(captured)
        prompts = _prompts(3, seed=21)
        runs = [Greedy(engine, p) for p in prompts]
        for _ in range(6):
            together(*runs)
        assert len(captured) == n  # nothing captured while the batch stays within the smallest context
        runs.append(Greedy(engine, [(5 * i) % 1000 + 2 for i in range(contexts[0] + 3)]))  # past it
        for _ in range(3):
            together(*runs[1:])
        assert captured[n:] == [("BatchStep", 3, contexts[1])]  # that batch size at the next context, once
        alone = [Greedy(engine, p) for p in prompts] + [Greedy(engine, [(5 * i) % 1000 + 2
                                                                          for i in range(contexts[0] + 3)])]
        for r, n_steps in zip(alone, (6, 9, 9, 3)):
            for _ in range(n_steps):
                r.alone()
        assert [r.tokens for r in runs] == [r.tokens for r in alone]
    finally:
        engine.close()


@pytest.mark.slow  # a speculative engine of its own
def test_a_speculating_session_drafts_again_after_batched_steps(compiled, tiny_ckpt):
    """Each session's MTP drafter follows its batched tokens: decoding alone afterwards it drafts at once, and
    its reply (batched, then speculative) is plain decoding's."""
    from test_engine_speculative import plain, speculative_plan

    from ostinato.runtime.engine import generate

    plan = speculative_plan(compiled[0], "mixed", "mixed")
    engine = load_engine(plan.replace(policy=plan.policy.replace(sessions=2)), tiny_ckpt, device="cpu", parallel=2)
    try:
        prompts = _prompts(2, seed=31)
        want = [plain(engine.new_session(), p, 20) for p in prompts]
        runs = [Greedy(engine, p) for p in prompts]
        for _ in range(8):
            together(*runs)
        for run, tokens in zip(runs, want):
            assert run.session.drafter.end == len(run.session)  # it followed every batched token
            before = run.session.drafted
            rest = generate(run.session, run.logits, 12)
            assert run.tokens + list(rest.tokens) == tokens
            assert run.session.drafted > before  # it drafted again once alone
    finally:
        engine.close()


@pytest.mark.slow  # a speculative engine of its own, its steps run through the capture path
def test_the_verify_step_has_a_step_per_decode_context_as_decode_does(compiled, tiny_ckpt, monkeypatch):
    """The 2-token step (a speculative verify) is captured per decode context at load and runs at the smallest
    that holds its tokens, so speculation reads no more rows than plain decoding; replies stay plain decoding's."""
    from test_engine_speculative import plain, speculative, speculative_plan

    from ostinato.buckets import decode_contexts
    from ostinato.runtime.engine import decode_graphs, step_runner

    captured = []
    monkeypatch.setattr(step_runner, "on_gpu", lambda step: True)
    monkeypatch.setattr(decode_graphs.SegmentGraphs, "capture",
                        lambda self, real=decode_graphs.SegmentGraphs.capture: (captured.append(
                            (type(self.step).__name__, self.step.tokens, getattr(self.step, "context", None))),
                                                                   real(self))[-1])
    engine = load_engine(speculative_plan(compiled[0], "mixed", "mixed"), tiny_ckpt, device="cpu")
    try:
        contexts = decode_contexts(engine.plan.policy.context)
        assert {("StaticStep", 2, c) for c in contexts} <= set(captured)
        prompt = _prompts(1, seed=41)[0]
        es = engine.new_session()
        assert speculative(es, prompt, 16) == plain(engine.new_session(), prompt, 16)
        runner = engine.step_runner
        assert runner._within(runner.pair_steps, 2).step.context == contexts[0]  # its position is within it
    finally:
        engine.close()
