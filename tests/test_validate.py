"""The published rows (plans/published/), the validation tool's verdicts, and the README table it writes."""

from pathlib import Path

import pytest

from ostinato.bench import validate
from ostinato.bench.published import BOXES_DIR, PUBLISHED_DIR, Bound, RowError, box_spec, load_rows
from ostinato.bench.simulator.kernels import KERNELS_FILE, OURS, load_kernel_table
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
    ([2.1, 2.8], (1.7, 2.5), 1.0, True),        # the ranges meet
    ([2.1, 2.8], (0.5, 1.0), 1.0 / 2.1, False),  # below: the model's high end over the published low end
    ([0.45, 0.78], (1.0, 1.2), 1.0 / 0.78, True),
])
def test_the_verdict_compares_values_and_ranges(published, model, ratio, within):
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
    boxes = validate.Boxes(KERNELS_FILE)
    top8 = validate.model_figure(rows["routing-top8"], boxes)
    assert top8[0] == top8[1] and 0.3 < top8[0] < 0.45
    one, four = (validate.model_figure(rows[r], boxes)[0] for r in ("kt-pr2175-kernel-1token",
                                                                     "kt-pr2175-kernel-4tokens"))
    expert = 13_369_344
    assert one >= 6 * expert / (0.8 * 226e9) * 1e6 * (1 - 1e-9)    # never faster than the box's expert read
    assert four >= one                                              # more tokens per expert cost more


def test_the_presets_kernel_rates_are_the_measured_ostinato_row():
    """plans/hardware's expert_kernel copies bench/measured/cpu_expert_kernels.yaml's Ostinato row."""
    ours = load_kernel_table().of(OURS)
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
