"""MTP speculative decoding, priced: the step's arithmetic, the cost model's expectation and the simulator's
per-trace pricing on a hand-built machine, and the rows it adds to the documented tables."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from simulator_helpers import ACT, EXPERT, HW, MS

from ostinato.bench.simulator.ktransformers import KTransformers
from ostinato.bench.simulator.ostinato_policy import MTP_ACCEPTANCE, MTP_NAME, Ostinato
from ostinato.compiler.cost_model import CostModel, LayerCostInputs, MtpCostInputs, speculative_step

ROOT = Path(__file__).resolve().parents[1]


def cost(layers=1, experts=4, hot=(0, 1), mtp=None):
    """No attention, head or hops cost anything (unless `mtp` gives the MTP block dense bytes): only experts
    and the link; top-1 routing, every expert equally likely."""
    cfg = SimpleNamespace(num_experts_per_tok=1, hidden_size=1, moe_intermediate_size=1, sliding_window=0,
                          index_topk=0, num_attention_heads=1, head_dim=1, hc_mult=1, vocab_size=0,
                          compress_ratio=lambda layer: 0)
    mask = np.zeros(experts, dtype=bool)
    mask[list(hot)] = True
    share = np.full(experts, 1.0 / experts)
    return CostModel(cfg, HW, [LayerCostInputs(0, 0, 0, mask, share) for _ in range(layers)], EXPERT, 0, 0, mtp=mtp)


def test_the_step_is_one_plus_a_tokens_for_draft_verify_and_the_expected_rerun():
    s = speculative_step(0.9, draft_s=2.0, verify_s=20.0, decode_s=10.0)
    assert s.tokens == pytest.approx(1.9) and s.seconds == pytest.approx(2.0 + 20.0 + 0.1 * 10.0)
    assert (s.draft_s, s.verify_s, s.rerun_s) == pytest.approx((2.0, 20.0, 1.0))
    eagle = speculative_step(0.5, draft_s=2.0, verify_s=20.0, decode_s=10.0, depth=3, rerun=False)
    assert eagle.tokens == pytest.approx(1 + 0.5 + 0.25 + 0.125) and eagle.seconds == pytest.approx(3 * 2.0 + 20.0)
    with pytest.raises(ValueError, match="acceptance"):
        speculative_step(1.5, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="depth"):
        speculative_step(0.9, 1.0, 1.0, 1.0, depth=2)   # the runtime re-runs only at depth 1


def test_the_mtp_block_is_priced_like_an_average_layer_plus_its_dense_part():
    c = cost()
    assert c.mtp_draft() == pytest.approx(c.decode_step())   # one layer, nothing else costs: the same split
    with_dense = cost(mtp=MtpCostInputs(0, dense_bytes=500, dense_params=0))  # 0.5 ms more on the GPU
    first, gpu, cpu = with_dense.split_layer(0, 1)
    # the dense part runs before the experts (its router picks them): it never hides behind the host's
    assert with_dense.mtp_draft() == pytest.approx(first + 0.5 * MS + max(gpu, cpu))


def test_with_no_acceptance_it_is_slower_than_plain_decoding_and_the_gain_grows_with_a():
    c = cost(layers=2)
    plain, none = c.speculative_decode(0.0)
    assert none.tokens == 1.0
    assert none.seconds == pytest.approx(c.mtp_draft() + c.bucket_step(2) + c.decode_step())
    assert none.tokens_per_s < plain                      # drafting and verifying for nothing
    rates = [c.speculative_decode(a)[1].tokens_per_s for a in np.linspace(0, 1, 11)]
    assert all(b > a for a, b in zip(rates, rates[1:]))


def test_the_simulator_prices_each_token_its_share_of_a_step_hand_computed():
    c = cost()
    hot = c.layers[0].hot[None]
    ids = np.array([[[1]], [[3]]])                  # decode: hot e1, then cold e3
    plain, _ = Ostinato(c, hot, None, [2]).decode(ids)
    assert plain.tolist() == pytest.approx([1 * MS, 10 * MS + 2 * ACT])
    a = 0.9
    spec = Ostinato(c, hot, None, [2], mtp_acceptance=a)
    draft = c.mtp_draft()
    steps, f = spec.decode(ids)
    # each verify (a bucket step of 2) holds e1 and e3: the hot route on the GPU (1 ms) | the cold expert
    # on the host with both tokens' activations both ways; a rejection re-runs the token alone
    verify = max(1 * MS, 10 * MS + 2 * 2 * ACT)
    step = [draft + verify + (1 - a) * p for p in plain]
    assert steps[0] == pytest.approx(step[0])                                  # the wait waits for a whole step
    assert f.seconds == pytest.approx(sum(s / (1 + a) for s in step))          # tokens over the rate
    eager, _ = Ostinato(c, hot, None, [], mtp_acceptance=a).decode(ids)       # no bucket: an eager split of 2
    assert eager[0] == pytest.approx(draft + max(1 * MS, 10 * MS + 2 * 2 * ACT) + (1 - a) * plain[0])


def test_an_eagle_verify_keeps_its_pick_and_covers_depth_plus_one_tokens():
    c = cost()
    kt = KTransformers(c, threshold=4, gpu_experts=c.layers[0].hot[None])
    ids = np.array([[[0]], [[2]], [[3]], [[1]]])   # hot, cold, cold, hot
    spec = kt.with_mtp(0.5, 3)
    assert spec.name == "KTransformers + MTP" and kt.mtp is None
    steps, f = spec.decode(ids)
    tokens = 1 + 0.5 + 0.25 + 0.125
    # every 4-token verify holds all four ids: 2 hot experts on the GPU | 2 cold on the host, 4 activations
    verify = max(2 * MS, 2 * 10 * MS + 2 * 4 * ACT)
    draft = c.mtp_draft()
    assert steps[0] == pytest.approx(3 * draft + verify)
    assert f.seconds == pytest.approx(4 * (3 * draft + verify) / tokens)


def test_the_documented_tables_show_ostinato_with_and_without_mtp():
    from ostinato.bench.simulator.bench import DOC_BEGIN, DOC_END, HEADLINE_BEGIN, HEADLINE_END

    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    tables = doc[doc.index(DOC_BEGIN):doc.index(DOC_END)]  # the shipped sessions' tables
    assert MTP_NAME == f"Ostinato + MTP ({MTP_ACCEPTANCE:.0%} acceptance)"
    assert tables.count(f"| {MTP_NAME} |") == 4                   # 2 workloads x 2 configurations
    assert tables.count("| + MTP speculative decoding (depth 1, 90% acceptance) |") == 2   # each ablation
    headline = doc[doc.index(HEADLINE_BEGIN) + len(HEADLINE_BEGIN):doc.index(HEADLINE_END)]
    assert "| coding | at their best |" in headline
    assert "| Ostinato + MTP" not in headline                   # never a baseline of the headline


@pytest.mark.slow
def test_the_preset_world_has_the_mtp_rows_and_gains_from_them():
    from ostinato.bench.simulator.world import build_world
    w = build_world()
    for config in ("best", "documented"):
        assert [p.name for p in w.policies(config)][:2] == ["Ostinato", MTP_NAME]
    assert any(p.name.startswith("+ MTP") and p.mtp_acceptance == MTP_ACCEPTANCE for p in w.ablations())
    plain, step = w.cost.speculative_decode(MTP_ACCEPTANCE)
    assert 1.0 < step.tokens_per_s / plain < 1 + MTP_ACCEPTANCE


def test_the_plan_says_whether_speculation_pays_and_why(tmp_path):
    """predictions.speculative: the committed V4-Flash plan (it has an MTP block) with its modeled gain and
    the step it comes from; a checkpoint without the block gets pays false, saying so."""
    from ostinato.compiler.compile import CompileOptions, compile_plan
    from ostinato.plan import load_plan
    from ostinato.tiny import write_tiny_checkpoint

    flash = load_plan(ROOT / "plans" / "deepseek-v4-flash.rtx4090d-x4.yaml").predictions.speculative
    assert flash.acceptance == MTP_ACCEPTANCE and flash.pays == (flash.gain > 1)
    assert flash.decode_tokens_per_s > 0 and "2-token verify" in flash.reason
    bare = write_tiny_checkpoint(tmp_path / "bare", "tiny", seed=0, progress=False, mtp=False)
    plan = compile_plan(CompileOptions(bare, tmp_path / "plan.yaml", "cpu-only", kernel_dir=tmp_path / "k",
                                       build_kernels=False)).plan
    s = plan.predictions.speculative
    assert not s.pays and s.gain is None and "no MTP block" in s.reason
