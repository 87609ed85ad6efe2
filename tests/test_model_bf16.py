"""bfloat16 against float32 on the tiny model: greedy tokens over 64 decode steps.

The random tiny model has near-tied logits and near-tied router scores, so bf16 rounding can flip a
greedy pick. The float32 greedy sequence is the reference; bf16 is run on the same tokens (teacher
forced) and must pick the same token at every step except where float32's top two are within 1% of
the logit scale; such flips are reported by name. Free-running bf16 greedy must agree up to its first
flip, which must be one of those near-ties.
"""

from __future__ import annotations

import pytest
import torch
from conftest import teacher_forced_picks

from ostinato.runtime import load_model

pytestmark = pytest.mark.slow  # 64 greedy steps twice, tens of seconds

STEPS = 64
NEAR_TIE = 0.01  # of the logit scale


def test_bf16_greedy_matches_float32(tiny_ckpt):
    f32 = load_model(tiny_ckpt, dtype=torch.float32)
    b16 = load_model(tiny_ckpt, dtype=torch.bfloat16)
    assert b16.weights.layers[0].attn.wq_a.dtype == torch.bfloat16
    prompt = torch.randint(0, f32.config.vocab_size, (32,), generator=torch.Generator().manual_seed(5))

    tokens, picks_b, margins = teacher_forced_picks(f32.new_session(), b16.new_session(), prompt, STEPS)

    flips = [i for i in range(STEPS) if tokens[i] != picks_b[i]]
    for i in flips:
        print(f"near-tie flip at decode step {i}: float32 picks {tokens[i]}, bf16 picks {picks_b[i]}, "
              f"float32 top-2 margin {margins[i]:.2e} of the logit scale")
    not_ties = [i for i in flips if margins[i] >= NEAR_TIE]
    assert not not_ties, f"bf16 differs from float32 at steps {not_ties} where float32 had a clear winner"
    assert len(flips) <= STEPS // 16, f"too many near-tie flips: {flips}"

    free = b16.new_session()
    lb = free.prefill(prompt)[-1]
    for i in range(STEPS):
        if int(lb.argmax()) != tokens[i]:
            assert i in flips, f"free-running bf16 diverged at step {i}, not a near-tie step"
            print(f"free-running bf16 greedy equals float32 for the first {i} steps (then a near-tie flip)")
            break
        lb = free.decode(tokens[i])
