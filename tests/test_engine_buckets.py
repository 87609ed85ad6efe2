"""Short prefills through the engine's bucket steps (runtime/engine/step_runner.py), eagerly on the CPU.

Under every placement they must give the plain model's logits and greedy tokens, count their routes,
keep truncate / fork / snapshots exact, hand longer prompts to the dynamic path, and be graph-safe per
bucket (hot launch + cold host task inside, equal op traces at two positions, one or two segments).
"""

import pytest
import torch
from engine_helpers import IDS, _close, _variant, on_gpus
from graph_safety import first_difference, segment_owners, traced_step

from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.session import ContextFull

pytestmark = pytest.mark.slow  # the compiled plan and the reference model (tests/conftest.py)

BUCKETS = [2, 4, 8, 16, 32, 64]


def bucket_engine(compiled, tiny_ckpt, placement: str, gpus: int = 1, buckets=BUCKETS):
    plan, _ = compiled
    plan = _variant(plan, placement, None)
    plan = plan.replace(policy=plan.policy.replace(prefill_buckets=list(buckets)))
    return load_engine(on_gpus(plan, gpus), tiny_ckpt, device="cpu")


@pytest.mark.parametrize("placement", ["all-hot", "all-cold", "mixed", "random"])
def test_bucketed_prefills_equal_the_plain_model(compiled, tiny_ckpt, reference, placement):
    engine = bucket_engine(compiled, tiny_ckpt, placement)
    runner = engine.step_runner
    assert runner.largest_bucket == 64 and engine.executor.max_step_tokens == 64
    ours, ref = engine.new_session(), reference.new_session()
    # 57 = 32 + 16 + 8 + 1 from the start; 73 tokens (past the largest bucket: the dynamic path); then 19
    # tokens as 16 + 2 + 1 (CSA rows every 4 tokens, the tiny model's window of 16 crossed)
    for lo, hi in ((0, 57), (57, 130), (130, 149)):
        before = engine.executor.counters.copy()
        _close(ours.prefill(IDS[lo:hi], last_only=True)[-1], ref.prefill(IDS[lo:hi])[-1])
        c = engine.executor.counters.minus(before)
        L, k = engine.plan.model.layers, engine.plan.model.top_k
        bucketed = hi - lo <= runner.largest_bucket
        assert c.forwards == L * (bin(hi - lo).count("1") if bucketed else 1)
        assert c.routes_hot + c.routes_cold == (hi - lo) * k * L
        assert (c.decode_step_s > 0) == bucketed
    assert runner.owner is ours.session and len(ours) == 149 and ours.session.snapshots[-1].position == 149
    token, ours_tokens, ref_tokens = int(IDS[149]), [], []
    a, b = ours.decode(token), ref.decode(token)
    for _ in range(6):
        ours_tokens.append(int(a.argmax())), ref_tokens.append(int(b.argmax()))
        _close(a, b)
        a, b = ours.decode(ref_tokens[-1]), ref.decode(ref_tokens[-1])
    assert ours_tokens == ref_tokens
    engine.close()


def test_truncate_and_fork_after_bucketed_prefills(compiled, tiny_ckpt, reference):
    engine = bucket_engine(compiled, tiny_ckpt, "mixed")
    s = engine.new_session()
    s.prefill(IDS[:40], last_only=True)        # 32 + 8
    s.prefill(IDS[40:52], last_only=True)      # 8 + 4: a snapshot at 52
    fork = s.fork()
    s.truncate(45)                             # back to the snapshot at 40, 5 tokens again
    r = reference.new_session()
    r.prefill(IDS[:45])
    _close(s.prefill(IDS[45:60], last_only=True)[-1], r.prefill(IDS[45:60])[-1])
    rf = reference.new_session()
    rf.prefill(IDS[:52])
    _close(fork.prefill(IDS[100:103], last_only=True)[-1], rf.prefill(IDS[100:103])[-1])
    _close(s.decode(7), r.decode(7))
    assert [len(x) for x in (s, fork)] == [61, 55]
    engine.close()


def test_a_prompt_that_does_not_fit_runs_no_step(compiled, tiny_ckpt):
    plan, _ = compiled
    plan = _variant(plan, "mixed", None)
    plan = plan.replace(policy=plan.policy.replace(prefill_buckets=[2, 4, 8], context=30))
    engine = load_engine(plan, tiny_ckpt, device="cpu")
    s = engine.new_session()
    s.prefill(IDS[:26], last_only=True)
    with pytest.raises(ContextFull, match="26 tokens in the session and 5 more would pass the plan's context of 30"):
        s.prefill(IDS[26:31], last_only=True)  # 4 + 1 would fit, 5 does not: nothing runs
    assert len(s) == 26  # refused before any step ran
    s.prefill(IDS[26:30], last_only=True)  # 4 more fit: 4 = one bucket step
    assert len(s) == 30 and engine.step_runner.step.position == 30
    engine.close()


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_bucket_is_graph_safe_with_the_cold_host_task(compiled, tiny_ckpt, reference, gpus):
    """Per bucket, two steps at two positions (crossing the CSA, HCA and window boundaries of the tiny
    model): no host reads, each segment touching only its buffers, equal op traces, exact logits."""
    engine = bucket_engine(compiled, tiny_ckpt, "random", gpus, buckets=[2, 8, 32])
    runner = engine.step_runner
    ids = torch.randint(0, 1024, (200,), generator=torch.Generator().manual_seed(8))
    for T, step in runner.steps.items():
        session, ref = engine.new_session(), reference.new_session()
        session.prefill(ids[:110]), ref.prefill(ids[:110])  # eager: 110 > the largest bucket
        runner.bind(session.session)
        traces, owners = [], segment_owners(step)
        for p in (110, 110 + T):
            traces.append(traced_step(step, ids[p:p + T], owners))
            _close(step.logits, ref.prefill(ids[p:p + T])[-1])
        for a, b in zip(*traces):
            assert a and first_difference(a, b) is None, (T, first_difference(a, b))
        runner.release()
    engine.close()
