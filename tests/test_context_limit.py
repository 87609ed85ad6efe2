"""A session never passes the plan's context: the forward that would is refused before it runs, naming both
numbers and the compile option, with the fixed-shape steps and with the dynamic model alike."""

import pytest
from engine_helpers import IDS

from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.session import ContextFull


@pytest.mark.parametrize("static_decode", [True, False])
def test_a_forward_past_the_context_is_refused_and_the_session_stands(compiled, tiny_ckpt, static_decode):
    plan, _ = compiled
    plan = plan.replace(policy=plan.policy.replace(context=128, prefill_buckets=[2, 4, 8, 16]))
    engine = load_engine(plan, tiny_ckpt, device="cpu", static_decode=static_decode)
    s = engine.new_session()
    s.prefill(IDS[:120], last_only=True)
    with pytest.raises(ContextFull, match=r"120 tokens in the session and 9 more would pass the plan's context of "
                                          r"128 tokens .*ostinato-compile --context 129"):
        s.prefill(IDS[120:129], last_only=True)
    assert len(s) == 120  # nothing ran
    token = 5
    for _ in range(8):
        token = int(s.decode(token).argmax())
    assert len(s) == 128
    with pytest.raises(ContextFull, match="128 tokens in the session and 1 more"):
        s.decode(token)
    fork = s.fork()  # a fork keeps the plan's bound
    with pytest.raises(ContextFull):
        fork.decode(token)
    engine.close()


def test_ostinato_run_refuses_a_prompt_past_the_context_in_one_line(compiled, tiny_ckpt, capsys):
    from ostinato.runtime.cli import run as run_cli

    plan, work = compiled
    short = work / "context-128.yaml"  # beside the fixture's plan: the same relative paths
    plan.replace(policy=plan.policy.replace(context=128, prefill_buckets=[2, 4, 8, 16])).write(short)
    rc = run_cli.main([str(short), "--device", "cpu", "--decode", "eager", "--prompt", "word " * 400])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1
    assert "pass the plan's context of 128 tokens" in err and "ostinato-compile --context" in err
