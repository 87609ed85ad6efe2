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


@pytest.fixture(scope="module")
def recorded_with_mtp(tiny_ckpt):
    """The same session recorded by the model without and with its MTP block."""
    shape = SessionShape("test/one", (Turn(37, 4), Turn(9, 3), Turn(20, 0)))
    plain = record_profile(load_model(tiny_ckpt), tiny_ckpt, [shape], phase_boundary=16, seed=3, progress=False)
    mtp = record_profile(load_model(tiny_ckpt, mtp=True), tiny_ckpt, [shape], phase_boundary=16, seed=3,
                         progress=False)
    return plain, mtp


def test_recording_with_the_mtp_block_adds_its_row(recorded_with_mtp, tmp_path):
    plain, mtp = recorded_with_mtp
    L, k = plain.n_layers, plain.top_k
    assert plain.mtp_layers == 0 and mtp.mtp_layers == 1 and mtp.n_layers == L and mtp.counts.shape[0] == L + 1
    # the main layers route exactly as without the block (the block only follows them)
    assert torch.equal(mtp.counts[:L], plain.counts)
    assert torch.equal(mtp.phase_counts(PHASES), plain.phase_counts(PHASES))
    assert torch.equal(mtp.touched(), plain.touched()) and torch.equal(mtp.pass_tokens, plain.pass_tokens)
    # one pair per token the session ran but the last (whose next token is never known), in the pass that ran it:
    # the first prefill's 37 tokens give 36 pairs, every later token one
    row = mtp.counts[L]                                                        # [3, E]
    assert int(row.sum()) == (int(plain.pass_tokens.sum()) - 1) * k
    assert int(row[PHASES.index("decode")].sum()) == 7 * k
    assert int(row[PHASES.index("short_prefill")].sum()) == 9 * k
    assert int(row[PHASES.index("long_prefill")].sum()) == (36 + 20) * k
    assert torch.equal(mtp.mtp_counts(("decode",)), row[0]) and plain.mtp_counts(("decode",)) is None
    # stored as version 2 with its row count; read back whole
    mtp.save(tmp_path / "m.safetensors")
    back = load_profile(tmp_path / "m.safetensors")
    assert back.metadata()["version"] == "2" and back.mtp_layers == 1 and back.sha256() == mtp.sha256()
    with pytest.raises(ProfileError, match="field 'mtp_layers' is 1, profile 0 has 0"):
        merge_profiles([plain, mtp])


def test_a_profile_without_mtp_rows_is_version_1_as_before(recorded_with_mtp, tmp_path):
    p = _random_profile(4)
    assert set(p.metadata()) == {"format", "version", "n_layers", "n_experts", "top_k", "phase_boundary", "source",
                                 "model_fingerprint", "sessions"} and p.metadata()["version"] == "1"
    p.save(tmp_path / "p.safetensors")
    back = load_profile(tmp_path / "p.safetensors")
    assert back.mtp_layers == 0 and back.mtp_drafts == 0 and back.mtp_acceptance is None
    # its content hash (the tensors and metadata; safetensors orders the header's metadata at random) as before
    # version 2 existed
    assert back.sha256() == p.sha256() == "80f07ce42279593e51b2294491f75947493f001f8fb10e4dfb427466d7f31897"
    # recorded without the block: version 1, no acceptance (it measures nothing without the block's drafts)
    plain, _ = recorded_with_mtp
    assert plain.metadata()["version"] == "1" and plain.mtp_acceptance is None and "mtp_drafts" not in plain.metadata()
    with pytest.raises(ProfileError, match="field 'mtp_drafts' is 5 but the profile has no MTP rows"):
        RoutingProfile(counts=p.counts, top_k=2, phase_boundary=0, source="x", mtp_drafts=5, mtp_agreed=1)


def _decoded_positions(profile: RoutingProfile) -> list[int]:
    """The positions of the tokens the recorded decode steps ran (one token each)."""
    ends = torch.cumsum(profile.pass_tokens, 0)
    return [int(e) - 1 for e, ph in zip(ends, profile.pass_phase) if PHASES[int(ph)] == "decode"]


def _forcing(real, fed: list[int], forced: set[int]):
    """mtp_logits whose draft for each position in `forced` is the model's own pick there (fed[q]), by a large
    bias: so the drafts agree there and the count can be checked at positions known in advance."""
    def mtp_logits(model, streams, next_ids, start, cache, k=0, last_only=True):
        out = real(model, streams, next_ids, start, cache, k, last_only).clone()
        first = start + streams.shape[0] - out.shape[0]  # the pair of out's first row
        for i in range(out.shape[0]):
            if first + i + 2 in forced:                  # pair t drafts position t + 2
                out[i, fed[first + i + 2]] += 1e4
        return out
    return mtp_logits


def _recount(model, fed: list[int], decoded: list[int], draft_logits) -> tuple[int, int]:
    """Drafts and agreements, recounted from one forward of the whole token sequence: the decode step that ran
    the token at P drafts P+1 from pair P-1 and keeps it if the main model's pick from the logits of P is it."""
    logits, streams = model.new_session().extend(fed)                       # [T, V], [T, N, D]
    drafts = draft_logits(model, streams[:-1], torch.tensor(fed[1:]), 0, model.new_mtp_cache(),
                          last_only=False)                                  # [T-1, V]: row t drafts t + 2
    agreed = sum(int(drafts[p - 1].argmax()) == int(logits[p].argmax()) for p in decoded)
    return len(decoded), agreed


def test_recording_measures_the_mtp_blocks_greedy_acceptance(recorded, recorded_with_mtp, tiny_ckpt, monkeypatch,
                                                            tmp_path):
    from ostinato.runtime import profile_recording
    from ostinato.runtime.model.mtp import mtp_logits

    plain, fed = recorded            # every token the session ran, in order (the same with the block)
    _, mtp = recorded_with_mtp
    decoded = _decoded_positions(plain)
    assert decoded == [37, 38, 39, 40, 50, 51, 52]
    model = load_model(tiny_ckpt, mtp=True)
    # the block as it is (random weights: its drafts are almost never the model's pick)
    assert (mtp.mtp_drafts, mtp.mtp_agreed) == _recount(model, fed, decoded, mtp_logits) and mtp.mtp_drafts == 7
    assert mtp.mtp_acceptance == mtp.mtp_agreed / 7
    # drafts forced to the model's own pick at every other position whose pick the session shows (a decoded
    # token after a decoded token): exactly those agree more, where the recount says
    forced = {q for q in decoded if q - 1 in decoded}
    forced = set(sorted(forced)[::2])
    forcing = _forcing(mtp_logits, fed, forced)
    monkeypatch.setattr(profile_recording, "mtp_logits", forcing)
    shape = SessionShape("test/one", (Turn(37, 4), Turn(9, 3), Turn(20, 0)))
    got = record_profile(model, tiny_ckpt, [shape], phase_boundary=16, seed=3, progress=False)
    assert torch.equal(got.counts, mtp.counts)   # the bias changes drafts only, not what runs
    assert (got.mtp_drafts, got.mtp_agreed) == _recount(model, fed, decoded, forcing)
    assert got.mtp_agreed >= len(forced) == 3
    # stored in version 2's metadata, read back; merging adds the counts
    got.save(tmp_path / "g.safetensors")
    back = load_profile(tmp_path / "g.safetensors")
    assert back.metadata()["mtp_drafts"] == "7" and back.metadata()["mtp_agreed"] == str(got.mtp_agreed)
    assert (back.mtp_drafts, back.mtp_agreed) == (got.mtp_drafts, got.mtp_agreed) and back.sha256() == got.sha256()
    both = merge_profiles([mtp, got])
    assert (both.mtp_drafts, both.mtp_agreed) == (14, mtp.mtp_agreed + got.mtp_agreed)
    # imported, synthetic and uniform profiles measured none
    assert synthetic_profile(ModelConfig.from_json(tiny_ckpt)).mtp_acceptance is None
    report = build_report(back, None, 4).text
    assert f"MTP draft acceptance (depth 1, greedy): {got.mtp_agreed / 7:.1%} ({got.mtp_agreed} of 7" in report
    assert "MTP draft acceptance" not in build_report(plain, None, 4).text


def test_the_shipped_profiles_have_the_mtp_row_and_its_measured_acceptance():
    for name in ("tiny-planted", "tiny-planted-holdout", "tiny-uniform"):
        shipped = load_profile(plans_dir() / "profiles" / f"{name}.safetensors")
        assert shipped.mtp_layers == 1 and shipped.mtp_counts(PHASES) is not None
        # random weights: the block's drafts are the model's pick about as often as chance (the compiler then
        # leaves speculation off; tests/test_compile.py)
        assert shipped.mtp_drafts >= 100 and shipped.mtp_acceptance < 0.05


def test_synthetic_profiles_give_the_mtp_block_a_row_and_keep_the_layers_rows(tiny_ckpt):
    import dataclasses

    cfg = ModelConfig.from_json(tiny_ckpt)
    assert cfg.num_nextn_predict_layers == 1
    with_row = synthetic_profile(cfg, alpha=1.0)
    without = synthetic_profile(dataclasses.replace(cfg, num_nextn_predict_layers=0), alpha=1.0)
    assert with_row.mtp_layers == 1 and without.mtp_layers == 0
    assert torch.equal(with_row.counts[:cfg.n_layers], without.counts)
    row = with_row.mtp_counts(("decode",))
    assert sorted(row.tolist()) == sorted(without.counts[0, 0].tolist())  # the same Zipf law, its own ranking


def test_csv_and_npz_carry_the_mtp_row(tmp_path):
    p = _random_profile(6)
    with_row = RoutingProfile(counts=torch.cat((p.counts, p.counts[:1] + 1)), top_k=2, phase_boundary=0,
                              source="m", mtp_layers=1)
    export_csv(with_row, tmp_path / "m.csv")
    back = import_counts(tmp_path / "m.csv", 3, 10, 2, mtp_layers=1)
    assert back.mtp_layers == 1 and torch.equal(back.counts, with_row.counts)
    export_csv(p, tmp_path / "p.csv")  # no row for the block: a profile without it, not a row of zeros
    assert import_counts(tmp_path / "p.csv", 3, 10, 2, mtp_layers=1).mtp_layers == 0
    with pytest.raises(ProfileError, match=r"field 'layer' is 3; the model has 3 layers$"):
        import_counts(tmp_path / "m.csv", 3, 10, 2)
    np.savez(tmp_path / "dense.npz", counts=with_row.counts.numpy())
    assert torch.equal(import_counts(tmp_path / "dense.npz", 3, 10, 2, mtp_layers=1).counts, with_row.counts)


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
