"""Routing profiles: recording counts every route exactly, merge, CSV/NPZ import, refusal, report."""

import numpy as np
import pytest
import torch
from hf_reference import load_reference

from ostinato.checkpoint import ModelConfig
from ostinato.compiler.cli.profile import main as profile_main
from ostinato.compiler.profile import PHASES, ProfileError, RoutingProfile, load_profile, synthetic_profile
from ostinato.compiler.profile.counts_io import export_csv, import_counts
from ostinato.compiler.profile.merge import merge_profiles
from ostinato.compiler.profile.report import build_report, top_k_mask
from ostinato.plans import plans_dir
from ostinato.profile_format import pack_touched
from ostinato.runtime import load_model
from ostinato.runtime.profile_recording import record_profile
from ostinato.workload import SessionShape, Turn, read_sessions

WORKLOAD = plans_dir() / "workloads" / "agent_turns.csv"


class _Recorder:
    """Wraps a model so the test sees every token id fed to it, in order."""

    def __init__(self, model):
        self.model, self.fed = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def new_session(self):
        inner, fed = self.model.new_session(), self.fed

        class S:
            def prefill(self, ids, last_only=False):
                fed.extend(ids.tolist())
                return inner.prefill(ids, last_only)

            def decode(self, token):
                fed.append(int(token))
                return inner.decode(token)

        return S()


@pytest.fixture(scope="module")
def recorded(tiny_ckpt):
    model = _Recorder(load_model(tiny_ckpt))
    shape = SessionShape("test/one", (Turn(37, 4), Turn(9, 3), Turn(20, 0)))
    profile = record_profile(model, tiny_ckpt, [shape], phase_boundary=16, seed=3, progress=False)
    return profile, model.fed


@pytest.mark.slow  # transformers (the reference)
def test_counts_equal_a_recount_from_the_reference_router(recorded, tiny_ckpt):
    profile, fed = recorded
    ref = load_reference(str(tiny_ckpt))
    picked = {}

    def keep(layer):
        def hook(module, inputs, out):  # returns None: the output is left unchanged
            picked[layer] = out[2]
        return hook

    hooks = [layer.mlp.gate.register_forward_hook(keep(l)) for l, layer in enumerate(ref.model.layers)]
    try:
        with torch.no_grad():
            ref(torch.tensor([fed]))
    finally:
        for h in hooks:
            h.remove()
    E = profile.n_experts
    for layer, ids in picked.items():
        expected = torch.bincount(ids.reshape(-1), minlength=E)
        assert torch.equal(profile.counts[layer].sum(0), expected), f"layer {layer}"


def test_hash_layer_counts_are_the_tid2eid_histogram(recorded, tiny_ckpt):
    from ostinato.checkpoint.reader import Checkpoint

    profile, fed = recorded
    with Checkpoint.open(tiny_ckpt) as ckpt:
        tid2eid = ckpt.dequantized("layers.0.ffn.gate.tid2eid")
    expected = torch.bincount(tid2eid[torch.tensor(fed)].reshape(-1), minlength=profile.n_experts)
    assert torch.equal(profile.counts[0].sum(0), expected)


def test_passes_and_phases(recorded):
    profile, fed = recorded
    k = profile.top_k
    # 37 > boundary 16: long; 9 and 20: short / long; 7 decode steps
    assert profile.pass_tokens.tolist() == [37, 1, 1, 1, 1, 9, 1, 1, 1, 20]
    assert [PHASES[p] for p in profile.pass_phase.tolist()][:2] == ["long_prefill", "decode"]
    assert profile.pass_tokens.sum() == len(fed)
    for phase in range(3):
        tokens = int(profile.pass_tokens[profile.pass_phase == phase].sum())
        assert int(profile.counts[:, phase].sum()) == tokens * k * profile.n_layers
    assert (profile.pass_distinct[profile.pass_tokens == 1] == k).all()  # one token touches exactly k experts


def _random_profile(seed, passes=3):
    g = torch.Generator().manual_seed(seed)
    return RoutingProfile(counts=torch.randint(0, 100, (3, 3, 10), generator=g), top_k=2, phase_boundary=64,
                          source=f"r{seed}", sessions=(f"s{seed}", "shared"),
                          pass_tokens=torch.randint(1, 50, (passes,), generator=g),
                          pass_phase=torch.randint(0, 3, (passes,), generator=g),
                          pass_touched=pack_touched(torch.rand(passes, 3, 10, generator=g) > 0.5))


def test_merge_is_associative_and_preserves_totals():
    a, b, c = (_random_profile(s) for s in range(3))
    left = merge_profiles([merge_profiles([a, b]), c])
    right = merge_profiles([a, merge_profiles([b, c])])
    assert torch.equal(left.counts, right.counts) and torch.equal(left.counts, a.counts + b.counts + c.counts)
    assert torch.equal(left.pass_touched, right.pass_touched) and left.pass_tokens.numel() == 9
    assert left.sessions == ("s0", "shared", "s1", "s2")


def test_merge_refuses_different_models():
    other = RoutingProfile(counts=torch.zeros(3, 3, 12, dtype=torch.int64), top_k=2, phase_boundary=64, source="x")
    with pytest.raises(ProfileError, match="field 'n_experts' is 12"):
        merge_profiles([_random_profile(0), other])


def test_csv_round_trip_and_npz(tmp_path):
    p = _random_profile(5)
    export_csv(p, tmp_path / "c.csv")
    back = import_counts(tmp_path / "c.csv", 3, 10, 2)
    assert torch.equal(back.counts, p.counts)
    np.savez(tmp_path / "dense.npz", counts=p.counts.numpy())
    assert torch.equal(import_counts(tmp_path / "dense.npz", 3, 10, 2).counts, p.counts)
    nz = torch.nonzero(p.counts)
    np.savez(tmp_path / "rows.npz", layer=nz[:, 0].numpy(), phase=np.array([PHASES[i] for i in nz[:, 1]]),
             expert=nz[:, 2].numpy(), count=p.counts[nz[:, 0], nz[:, 1], nz[:, 2]].numpy())
    assert torch.equal(import_counts(tmp_path / "rows.npz", 3, 10, 2).counts, p.counts)


def test_import_names_the_bad_row(tmp_path):
    (tmp_path / "bad.csv").write_text("layer,expert,phase,count\n0,1,decode,5\n2,10,decode,1\n")
    with pytest.raises(ProfileError, match=r"bad.csv:3: field 'expert' is 10; the model has 10 experts"):
        import_counts(tmp_path / "bad.csv", 3, 10, 2)
    (tmp_path / "bad2.csv").write_text("layer,expert,phase,count\n0,1,prefill,5\n")
    with pytest.raises(ProfileError, match=r"bad2.csv:2: field 'phase' is 'prefill'"):
        import_counts(tmp_path / "bad2.csv", 3, 10, 2)


def test_save_load_round_trip(tmp_path):
    p = _random_profile(7)
    p.save(tmp_path / "p.safetensors")
    q = load_profile(tmp_path / "p.safetensors")
    assert q.sha256() == p.sha256() and torch.equal(q.touched(), p.touched())


def test_mismatched_profile_is_refused(tmp_path, tiny_ckpt, capsys):
    cfg = ModelConfig.from_json(tiny_ckpt)
    synthetic_profile(cfg).check_fits(cfg.n_layers, cfg.n_routed_experts, cfg.num_experts_per_tok)
    bad = _random_profile(1)
    with pytest.raises(ProfileError, match="field 'n_layers' is 3 but the model has 4"):
        bad.check_fits(cfg.n_layers, cfg.n_routed_experts, cfg.num_experts_per_tok)
    bad.save(tmp_path / "bad.safetensors")
    good = synthetic_profile(cfg)
    good.save(tmp_path / "good.safetensors")
    assert profile_main(["report", str(tmp_path / "good.safetensors"),
                         "--holdout", str(tmp_path / "bad.safetensors")]) == 1
    assert "recorded for another model" in capsys.readouterr().err


def test_report_uniform_is_low_and_says_so():
    cfg_counts = torch.full((4, 3, 16), 100, dtype=torch.int64)
    uniform = RoutingProfile(counts=cfg_counts, top_k=4, phase_boundary=1, source="uniform")
    report = build_report(uniform, None, 4)
    row = report.rows[report.ks.index(4)]
    assert row["decode"][0] == pytest.approx(4 / 16)
    assert "25.0%" in report.text and "uniform routing would give" in report.text


def test_top_k_mask_ties_take_lower_ids():
    p = RoutingProfile(counts=torch.tensor([[[5, 5, 5, 1]] * 3]), top_k=1, phase_boundary=1, source="x")
    assert top_k_mask(p, 2).tolist() == [[True, True, False, False]]


def test_workload_sessions_parse():
    sessions = read_sessions(WORKLOAD)
    assert len(sessions) == 45
    assert sum(len(s.turns) for s in sessions) == 2531
    assert all(s.turns[0].appended > 0 for s in sessions)


PROFILES = plans_dir() / "profiles"


def test_shipped_report_planted_hot_set_holds_on_held_out_sessions():
    planted = load_profile(PROFILES / "tiny-planted.safetensors")
    holdout = load_profile(PROFILES / "tiny-planted-holdout.safetensors")
    assert set(planted.sessions).isdisjoint(holdout.sessions)
    report = build_report(planted, holdout, 4)
    for phase in ("decode", "short_prefill"):
        in_sample, held_out = report.rows[report.ks.index(4)][phase]
        assert in_sample > 0.6 and abs(in_sample - held_out) < 0.03  # within a few points
    assert report.cold is not None and report.cold["median_cold"] > 0


def test_shipped_report_uniform_model_is_low():
    uniform = load_profile(PROFILES / "tiny-uniform.safetensors")
    report = build_report(uniform, None, 4)
    decode, _ = report.rows[report.ks.index(4)]["decode"]
    assert decode < 0.40  # near k/E = 25%: random routing has no useful hot set, and the report says so
