"""The published rows (plans/published/), the validation tool's verdicts, and the README table it writes."""

from pathlib import Path

import pytest

from ostinato.bench import paper_claims, validate
from ostinato.bench.published import BOXES_DIR, PUBLISHED_DIR, Bound, RowError, box_spec, load_rows
from ostinato.bench.simulator.kernels import (
    KERNEL_TABLES,
    OURS,
    load_kernel_table,
    load_kernel_tables,
    table_file,
    table_for_isa,
)
from ostinato.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[1]


def test_every_committed_row_and_box_parses_and_cites_its_source():
    rows = load_rows()
    assert len(rows) >= 15
    for rid, r in rows.items():
        assert r.source and r.context, rid
        load_hardware(box_spec(r.box))
    for box in BOXES_DIR.glob("*.yaml"):
        assert load_hardware(box).name == box.stem


def test_a_malformed_row_is_refused_by_file_and_field(tmp_path):
    good = (PUBLISHED_DIR / "paper-hot-share.yaml").read_text()
    (tmp_path / "bad.yaml").write_text(good.replace("metric: hot_share", "metric: speed"))
    with pytest.raises(RowError, match=r"bad.yaml.*field 'metric'"):
        load_rows(tmp_path)
    (tmp_path / "bad.yaml").write_text(good.replace("value: 0.84", "value: [0.9, 0.8]"))
    with pytest.raises(RowError, match=r"bad.yaml: field 'value': a range is \[low, high\]"):
        load_rows(tmp_path)
    (tmp_path / "bad.yaml").write_text(good.replace("box: rtx4090d-x4", "box: boxes/nowhere"))
    with pytest.raises(RowError, match="box boxes/nowhere"):
        box_spec(load_rows(tmp_path)["bad"].box)
    (tmp_path / "bad.yaml").unlink()
    with pytest.raises(RowError, match="no published rows"):
        load_rows(tmp_path)


@pytest.mark.parametrize("published, model, ratio, within", [
    (2.0, (2.0, 2.0), 1.0, True),
    (2.0, (2.9, 2.9), 1.45, True),
    (2.0, (3.1, 3.1), 1.55, False),
    ([2.1, 2.8], (2.2, 2.5), 1.0, True),         # inside: the only way to score 1.00
    ([2.1, 2.8], (1.7, 2.5), 1.7 / 2.1, True),   # meeting the band is not a match: its low end is 0.81x below
    ([2.1, 2.8], (0.5, 1.0), 0.5 / 2.1, False),  # below: the model's farthest point over the published low end
    ([0.45, 0.78], (1.0, 1.2), 1.2 / 0.78, False),
    ([1.4, 2.5], (2.35, 33.6), 33.6 / 2.5, False),   # paper-ostinato-sessions' shape: overlap once scored 1.00
    ([1.0, 2.0], (0.9, 2.5), 2.5 / 2.0, True),   # past both ends: the end it overshoots more (1.25x above, 1.11x below)
    ([1.0, 2.0], (0.5, 2.2), 0.5, False),        # 2x below outweighs 1.1x above
])
def test_the_score_is_the_distance_between_the_bands(published, model, ratio, within):
    v = validate.verdict(published, model)
    assert v.ratio == pytest.approx(ratio) and v.within is within


def test_a_bound_holds_or_not():
    assert validate.verdict(Bound(below=1.0), (0.5, 0.9)).within
    assert not validate.verdict(Bound(below=1.0), (0.5, 1.1)).within
    assert validate.verdict(Bound(below=1.0), (0.5, 0.9)).ratio is None


def test_routing_rows_come_from_the_profile_and_the_kernel_rows_from_the_rule():
    """No session replay: the synthetic profile's coverage of its best N experts, and kt-kernel's
    published row priced by its measured per-core rate times the box's workers, capped by the read."""
    rows = load_rows()
    boxes = validate.Boxes(KERNEL_TABLES)
    top8 = validate.model_figure(rows["routing-top8"], boxes)
    assert top8[0] == top8[1] and 0.3 < top8[0] < 0.45
    one, four = (validate.model_figure(rows[r], boxes)[0] for r in ("kt-pr2175-kernel-1token",
                                                                     "kt-pr2175-kernel-4tokens"))
    expert = 13_369_344
    assert one >= 6 * expert / 182.3e9 * 1e6 * (1 - 1e-9)    # never faster than the box's published expert read
    assert four >= one                                              # more tokens per expert cost more


def test_each_box_is_priced_with_its_isas_kernel_table_and_the_table_says_which():
    """The AVX2 EPYC box gets the avx2 table; the AMX preset the avx512_bf16 one (no AMX table), stated in the
    validation table's list of boxes."""
    rows = load_rows()
    boxes = validate.Boxes(KERNEL_TABLES)
    epyc, amx = boxes.world(rows["kt-pr2175-kernel-4tokens"]), boxes.world(rows["routing-top8"])
    assert epyc.build.hardware.host.isa == "avx2" and epyc.kernels.isa == "avx2" and epyc.kernels.notes == ()
    assert epyc.kernel("kt-kernel") == load_kernel_table(table_file("avx2")).of("kt-kernel")
    assert amx.build.hardware.host.isa == "amx" and amx.kernels.isa == "avx512_bf16"
    assert amx.kernel(OURS) == load_kernel_table(table_file("avx512_bf16")).of(OURS)
    listed = boxes.kernel_tables()
    assert listed[0] == "boxes/epyc7452x2 (avx2): the avx2 table"
    assert listed[1].startswith("rtx4090d-x4 (amx): the avx512_bf16 table; no amx kernel table") \
        and "AMX is not measured" in listed[1]


def test_each_presets_kernel_rates_are_the_ostinato_row_of_its_isas_table():
    """plans/hardware's expert_kernel (the compiler's own pricing) copies the Ostinato row of the table that prices
    a box of the preset's host ISA (kernels.py table_for_isa): the AMX presets the avx512_bf16 row (no AMX table;
    Ostinato's amx build is that path), the AVX2 cpu-only preset the avx2 row, never the AVX2 row for an AMX host."""
    tables = load_kernel_tables(KERNEL_TABLES)
    for preset, isa, table in (("rtx4090d-x4", "amx", "avx512_bf16"), ("h200-x1", "amx", "avx512_bf16"),
                               ("cpu-only", "avx2", "avx2")):
        host = load_hardware(preset).host
        assert host.isa == isa, preset
        ours = table_for_isa(tables, isa).of(OURS)
        assert ours == tables[table].of(OURS)
        k = host.expert_kernel
        assert k is not None, preset
        assert tuple(k.tokens_per_expert) == ours.tokens and tuple(k.per_core) == ours.per_core, preset
        assert table in k.source, preset


@pytest.mark.slow
def test_the_documented_validation_table_is_the_tools_output():
    doc = (ROOT / validate.DOC).read_text()
    block = doc[doc.index(validate.DOC_BEGIN) + len(validate.DOC_BEGIN):doc.index(validate.DOC_END)]
    validation = validate.Validation(load_rows())
    assert block.strip() == validation.table(), \
        f"{validate.DOC}'s table is stale: run python -m ostinato.bench.validate --doc"
    begin, end = paper_claims.CLAIMS_BEGIN, paper_claims.CLAIMS_END
    claims = doc[doc.index(begin) + len(begin):doc.index(end)]
    assert claims.strip() == validation.claims_table(), \
        f"{validate.DOC}'s paper claims are stale: run python -m ostinato.bench.validate --doc"
    readme = (ROOT / "README.md").read_text()
    begin, end = paper_claims.README_BEGIN, paper_claims.README_END
    summary = readme[readme.index(begin) + len(begin):readme.index(end)]
    assert summary.strip() == paper_claims.claims_summary(validation.claims()).strip(), \
        "README.md's paper claims summary is stale: run python -m ostinato.bench.validate --readme"


def row_file(folder: Path, name: str, **changes) -> None:
    """A copy of a committed row with `changes` (top-level YAML fields, written as YAML)."""
    import yaml
    data = yaml.safe_load((PUBLISHED_DIR / f"{name}.yaml").read_text())
    data.update(changes)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(data))


def test_calibration_rows_are_shown_apart_and_left_out_of_the_count(tmp_path):
    row_file(tmp_path, "routing-top8", calibration="the profile's Zipf exponent")
    row_file(tmp_path, "paper-hot-share")
    rows = load_rows(tmp_path)
    assert rows["routing-top8"].calibration and not rows["paper-hot-share"].calibration
    v = validate.Validation(rows)
    v.__dict__["verdicts"] = {"routing-top8": validate.verdict(0.356, (0.9, 0.9)),     # far off, but calibration
                              "paper-hot-share": validate.verdict(0.84, (0.83, 0.83))}
    table = v.table()
    assert "1 of 1 rows within 1.5x" in table and "1 calibration rows" in table
    assert "calibration (not counted): sets the profile's Zipf exponent" in table


def test_the_committed_calibration_rows_are_the_ones_constants_come_from():
    """The 0.8 read fraction and the epyc box's kernel read come from kt-kernel's 1-token row (PR #2175), the
    routing profile's shape from the four routing rows: those rows are marked, the others are checks."""
    rows = load_rows()
    marked = {rid for rid, r in rows.items() if r.calibration}
    assert marked == {"kt-pr2175-kernel-1token", "routing-top8", "routing-top16", "routing-top32", "routing-top64"}


def test_the_epyc_box_reads_experts_at_its_published_kernel_rate():
    """PR #2175 publishes kt-kernel's own read on that box (6 experts x 13.37 MB in 440 us): the box carries it,
    so its 1-token row is priced at exactly that, not at 0.8 x STREAM."""
    host = load_hardware(box_spec("boxes/epyc7452x2")).host
    assert host.expert_read_bandwidth == pytest.approx(6 * 13_369_344 / 440e-6, rel=1e-3)
    rows = load_rows()
    one = validate.model_figure(rows["kt-pr2175-kernel-1token"], validate.Boxes(KERNEL_TABLES))[0]
    assert one == pytest.approx(440.0, rel=1e-3)


def test_the_numa_rule_reads_a_socket_per_pool():
    host = load_hardware(box_spec("boxes/epyc7452x2")).host
    assert validate.numa_host(host, 2, 2) == host and validate.numa_host(host, 1, 1) == host
    half = validate.numa_host(host, 2, 1)      # one pool on a two-socket box: half the box's read
    assert half.bandwidth == host.bandwidth / 2 and half.expert_read_bandwidth == host.expert_read_bandwidth / 2
    assert validate.numa_host(host, 2, 4) == host   # pools past the sockets add nothing
    with pytest.raises(ValueError, match="sockets 0"):
        validate.numa_host(host, 0, 1)


def test_a_row_with_one_pool_on_two_sockets_is_priced_at_half_the_read(tmp_path):
    """kt-kernel's 1-token row is bound by the read: one pool instead of one per socket doubles its time."""
    row_file(tmp_path, "kt-pr2175-kernel-1token")
    two = load_rows(tmp_path)["kt-pr2175-kernel-1token"]
    assert two.sockets == 2 and two.system.pools == 2
    one = two.model_copy(update={"system": two.system.model_copy(update={"pools": 1})})
    boxes = validate.Boxes(KERNEL_TABLES)
    assert validate.model_figure(one, boxes)[0] == pytest.approx(2 * validate.model_figure(two, boxes)[0])


def test_each_paper_claim_is_priced_by_a_committed_ratio_row_on_its_stated_side():
    """Every claim of the abstract the claims table checks is a committed row whose published figure lies on the
    side of 1 the claim states (so the table cannot call a claim right that the paper does not make)."""
    rows = load_rows()
    assert len(paper_claims.CLAIMS) == 4
    for c in paper_claims.CLAIMS:
        value = rows[c.row].value
        if isinstance(value, Bound):                 # "< x": the paper's side is below 1 when x is at most 1
            assert c.side == "below 1" and value.below <= 1.0, c.row
        else:
            assert paper_claims.direction_right(c.side, tuple(value)), c.row
        assert rows[c.row].source.startswith("arXiv 2611.11533"), c.row


@pytest.mark.parametrize("side, model, right", [
    ("below 1", (0.5, 0.9), True),
    ("below 1", (0.5, 1.1), False),     # a band across 1 is not the paper's direction
    ("above 1", (1.2, 3.0), True),
    ("above 1", (0.7, 0.7), False),
])
def test_a_claims_direction_is_right_only_when_the_whole_band_is_on_its_side(side, model, right):
    assert paper_claims.direction_right(side, model) is right
    with pytest.raises(ValueError, match="side 'sideways'"):
        paper_claims.direction_right("sideways", model)


def test_the_claims_table_says_wrong_with_the_rows_reason_and_counts_the_right_ones():
    rows = load_rows()
    claims = {c.row: c for c in paper_claims.CLAIMS}
    wait, decode = "paper-llamacpp-layers-wait", "paper-llamacpp-layers-decode"
    rows[wait] = rows[wait].model_copy(update={"why_off": "the reason, with its source"})
    found = [paper_claims.ClaimVerdict(claims[wait], (1.05, 1.15), False, False, rows[wait].why_off),
             paper_claims.ClaimVerdict(claims[decode], (1.7, 1.7), True, True, "")]
    table = paper_claims.claims_table(rows, found)
    line = next(x for x in table.splitlines() if wait in x)
    assert "**wrong** (the paper: below 1)" in line and "the reason, with its source" in line and "1.05-1.15" in line
    assert "right (above 1)" in next(x for x in table.splitlines() if decode in x)
    assert "right on 1 of 2" in table and f"Wrong: {wait}" in table


def test_validation_gives_each_claim_its_rows_model_band():
    rows = load_rows()
    v = validate.Validation(rows)
    v.__dict__["verdicts"] = {rid: validate.verdict(r.value, (0.5, 0.5) if rid.startswith("paper-") else (1, 1))
                              for rid, r in rows.items()}
    found = {f.claim.row: f for f in v.claims()}
    assert set(found) == {c.row for c in paper_claims.CLAIMS}
    assert found["paper-llamacpp-layers-wait"].right and not found["paper-ostinato-sessions"].right
    assert found["paper-ostinato-sessions"].why == rows["paper-ostinato-sessions"].why_off


def test_readme_gets_the_claims_summary_between_its_markers(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{paper_claims.README_BEGIN}\nold\n{paper_claims.README_END}\nrest\n")
    rows = load_rows()
    fixed = {rid: validate.verdict(r.value, (1.0, 1.0)) for rid, r in rows.items()}
    monkeypatch.setattr(validate.Validation, "verdicts", fixed)
    assert validate.main(["--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("rest\n")
    assert "The model's direction is right on 0 of 4" in text
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="paper claims summary"):
        validate.main(["--readme", str(readme)])


def test_the_llama_cpp_expert_cache_computes_its_misses_with_ggmls_kernel():
    """The LRU cache computes its misses on the CPU (bench/simulator/llamacpp.py), so it is priced with ggml's
    measured rates like llama.cpp's other placements, not with Ostinato's."""
    world = validate.Boxes(KERNEL_TABLES).world(load_rows()["routing-top8"])
    for config in ("documented", "best"):
        by_name = {p.name: p for p in world.policies(config)}
        lru, layers = by_name["llama.cpp LRU cache"], by_name["llama.cpp layers"]
        assert lru.cost.host_kernel == world.kernel("ggml") == layers.cost.host_kernel != world.kernel(OURS)


def test_the_two_socket_h200_preset_reads_experts_by_the_numa_rule():
    """Ostinato runs one expert pool across both sockets of h200-x1 (cold experts round-robin over the NUMA nodes):
    the preset's expert read is the NUMA rule's share for one pool on two sockets, as a published row's would be."""
    from ostinato.compiler.host_kernel import EXPERT_READ_FRACTION, expert_read_bandwidth, numa_read_share
    host = load_hardware("h200-x1").host
    assert numa_read_share(2, 1) == 0.5 and numa_read_share(2, 2) == numa_read_share(1, 1) == numa_read_share(2, 4) == 1
    assert expert_read_bandwidth(host) == pytest.approx(EXPERT_READ_FRACTION * host.bandwidth * numa_read_share(2, 1),
                                                        rel=1e-3)
    one_socket = load_hardware("rtx4090d-x4").host          # one socket: the whole read, 0.8 of it
    assert expert_read_bandwidth(one_socket) == pytest.approx(EXPERT_READ_FRACTION * one_socket.bandwidth)
    with pytest.raises(ValueError, match="pools 0"):
        numa_read_share(2, 0)
