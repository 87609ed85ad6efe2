"""The bf16 engine on the GPU (decode graphs, hot experts in Triton, cold ones through host nodes) against the
float32 model on the CPU, both fed the float32 model's greedy tokens: its greedy picks agree wherever
float32's top two are not a near-tie. Its max logit error is recorded beside the CPU bf16 model's (how far
bf16 rounding alone moves this random model's logits)."""

from __future__ import annotations

import pytest
import torch

from ostinato.bench.gpu_setup import rel_err, tolerance
from ostinato.runtime import load_model

pytestmark = pytest.mark.gpu
# of the logit scale: where float32's top two are closer than a few bf16 roundings, bf16 may pick the other
NEAR_TIE = tolerance(torch.bfloat16)


def test_bf16_engine_picks_what_the_float32_model_picks(h200, figure):
    prompt, steps = (100, 36) if h200.cuda else (24, 7)
    engine = h200.engine(graphs=True)
    try:
        reference, cpu_bf16 = load_model(h200.ckpt), load_model(h200.ckpt, dtype=torch.bfloat16)
        ids = torch.randint(0, reference.config.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0))
        sessions = [reference.new_session(), engine.new_session(), cpu_bf16.new_session()]
        ref, ours, bf16 = (s.prefill(ids, last_only=True)[-1].float().cpu() for s in sessions)
        engine_err = bf16_err = 0.0
        flips, clear_flips = 0, []
        for step in range(steps):  # each decode's logits but the last step's are compared
            engine_err, bf16_err = max(engine_err, rel_err(ours, ref)), max(bf16_err, rel_err(bf16, ref))
            token, top = int(ref.argmax()), ref.topk(2).values
            if int(ours.argmax()) != token:
                flips += 1
                margin = ((top[0] - top[1]) / ref.abs().max()).item()
                if margin >= NEAR_TIE:
                    clear_flips.append((step, margin))
            ref, ours, bf16 = (s.decode(token).float().cpu() for s in sessions)
    finally:
        engine.close()
    figure("bf16_err/cpu_bf16", engine_err / bf16_err)
    figure("greedy_agree", (steps - flips) / steps)
    assert not clear_flips, f"(step, top-2 margin) where bf16 picked another token: {clear_flips}"
    assert flips <= max(1, steps // 8), f"{flips} of {steps} picks differ"
