"""The engine in bfloat16 end to end on the CPU: split-route and upload-once prefill, decode through
the fixed-shape step, against the float32 engine's greedy tokens.

As in test_model_bf16: the random tiny model has near-tied logits and router scores, so bf16 rounding
can flip a greedy pick where float32's top two are within 1% of the logit scale. The float32 engine's
greedy sequence is the reference; the bf16 engine follows the same tokens (teacher forced) and must
pick the same token at every step except at such near-ties (reported by name); free-running bf16
greedy must agree up to its first flip, which must be one of them.
"""

from __future__ import annotations

import pytest
import torch
from conftest import teacher_forced_picks
from engine_helpers import IDS, _engine

from ostinato.runtime.cli.run import main as run_main

pytestmark = pytest.mark.slow  # the compiled plan (tests/conftest.py)

STEPS = 24
NEAR_TIE = 0.01  # of the logit scale


@pytest.mark.parametrize("mode", ["split", "upload"])
def test_bf16_engine_greedy_matches_the_float32_engine(compiled, tiny_ckpt, mode):
    threshold = None if mode == "split" else 16
    f32 = _engine(compiled, tiny_ckpt, "mixed", threshold=threshold)
    b16 = _engine(compiled, tiny_ckpt, "mixed", threshold=threshold, dtype=torch.bfloat16)
    assert b16.model.weights.layers[0].attn.wq_a.dtype == torch.bfloat16 and b16.step_runner is not None
    prompt = IDS[:40]
    tokens, picks, margins = teacher_forced_picks(f32.new_session(), b16.new_session(), prompt, STEPS)

    flips = [i for i in range(STEPS) if tokens[i] != picks[i]]
    for i in flips:
        print(f"{mode}: near-tie flip at step {i}: float32 picks {tokens[i]}, bf16 {picks[i]}, "
              f"float32 top-2 margin {margins[i]:.2e} of the logit scale")
    assert not [i for i in flips if margins[i] >= NEAR_TIE], f"bf16 differs where float32 had a clear winner: {flips}"
    assert len(flips) <= STEPS // 8, f"too many near-tie flips: {flips}"

    c = b16.executor.counters  # every path ran in bf16: hot and cold routes, uploads, the decode step
    assert c.routes_hot > 0 and c.routes_cold > 0 and c.decode_step_s > 0
    assert (c.experts_uploaded > 0) == (mode == "upload")

    free = b16.new_session()
    lb = free.prefill(prompt)[-1]
    for i in range(STEPS):
        if int(lb.argmax()) != tokens[i]:
            assert i in flips, f"free-running bf16 diverged at step {i}, not a near-tie step"
            break
        lb = free.decode(tokens[i])
    f32.close(), b16.close()


def test_ostinato_run_in_bfloat16_through_every_decode_mode(compiled, tiny_ckpt, capsys, monkeypatch):
    _, work = compiled
    monkeypatch.chdir(work)
    for mode in ("graph", "eager", "dynamic"):
        assert run_main(["plan.yaml", "--model", str(tiny_ckpt), "--device", "cpu", "--dtype", "bfloat16",
                         "--prompt", "Hello", "--max-new", "4", "--decode", mode]) == 0
        assert capsys.readouterr().out.splitlines()[-1].strip()
