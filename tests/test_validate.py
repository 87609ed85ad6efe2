"""The published rows (plans/published/), the validation tool's verdicts, and the README table it writes."""

from pathlib import Path

import pytest

from ostinato.bench import validate
from ostinato.bench.published import BOXES_DIR, PUBLISHED_DIR, Bound, RowError, box_spec, load_rows
from ostinato.bench.simulator.kernels import KERNEL_TABLES, OURS, load_kernel_table, table_file
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


def test_the_presets_kernel_rates_are_the_measured_ostinato_row():
    """plans/hardware's expert_kernel copies the avx2 table's Ostinato row (the compiler's own pricing; the
    simulator prices each box with its ISA's table, kernels.py)."""
    ours = load_kernel_table(table_file("avx2")).of(OURS)
    for preset in ("rtx4090d-x4", "h200-x1", "cpu-only"):
        k = load_hardware(preset).host.expert_kernel
        assert k is not None, preset
        assert tuple(k.tokens_per_expert) == ours.tokens and tuple(k.per_core) == ours.per_core, preset


@pytest.mark.slow
def test_the_documented_validation_table_is_the_tools_output():
    doc = (ROOT / validate.DOC).read_text()
    block = doc[doc.index(validate.DOC_BEGIN) + len(validate.DOC_BEGIN):doc.index(validate.DOC_END)]
    table = validate.Validation(load_rows()).table()
    assert block.strip() == table, f"{validate.DOC}'s table is stale: run python -m ostinato.bench.validate --doc"


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
