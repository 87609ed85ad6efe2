"""The CPU kernel tables, one per ISA (bench/measured/cpu_expert_kernels.<isa>.yaml): each box gets its ISA's,
or the nearest measured one with the reason stated; malformed tables are refused by file and field."""

from pathlib import Path

import pytest
import yaml

from ostinato.bench import kernel_side_by_side as ks
from ostinato.bench.published import BOXES_DIR
from ostinato.bench.simulator.kernels import (
    KERNEL_TABLES,
    NEAREST,
    OURS,
    kernels_for,
    load_kernel_table,
    load_kernel_tables,
    table_file,
    table_for_isa,
)
from ostinato.hardware import load_hardware
from ostinato.isa import ISAS

PRESETS = Path(__file__).resolve().parents[1] / "plans" / "hardware"


def write_table(folder: Path, isa: str, systems=("ostinato", "kt-kernel", "ggml"), scale: float = 1.0,
                name: str | None = None, changes: dict | None = None) -> Path:
    """A small table measured "at" isa: each system's per-core rates distinct per ISA (scale) and per system."""
    data = {"source": f"hand, {isa}", "cpu": "test", "isa": isa, "cores": 2, "read_bandwidth": 2.0e10,
            "tokens_per_expert": [1.0, 4.0, 64.0],
            "systems": {s: {"threads": 2, "reserved_cores": int(s == "kt-kernel"),
                            "per_core": [scale * (i + 1) * r for r in (4e9, 2e9, 2e8)], "driven": s}
                        for i, s in enumerate(systems)}}
    data.update(changes or {})
    path = folder / (name or table_file(isa, folder).name)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_each_isa_gets_its_own_table_when_one_was_measured(tmp_path):
    write_table(tmp_path, "avx2", scale=1.0)
    write_table(tmp_path, "avx512_bf16", scale=2.0)
    tables = load_kernel_tables(tmp_path)
    assert set(tables) == {"avx2", "avx512_bf16"}
    for isa in ("avx2", "avx512_bf16"):
        t = table_for_isa(tables, isa)
        assert t.isa == isa and t.notes == ()
        assert t.of(OURS).per_core == tables[isa].of(OURS).per_core
    assert table_for_isa(tables, "avx512_bf16").of("kt-kernel").per_core[0] == 2.0 * 2 * 4e9


def test_an_isa_without_a_table_gets_the_nearest_measured_one_and_says_why(tmp_path):
    write_table(tmp_path, "avx2", scale=1.0)
    write_table(tmp_path, "avx512_bf16", scale=2.0)
    tables = load_kernel_tables(tmp_path)
    amx = table_for_isa(tables, "amx")
    assert amx.isa == "avx512_bf16" and amx.systems == tables["avx512_bf16"].systems
    assert len(amx.notes) == 1 and "no amx kernel table" in amx.notes[0] and "AMX is not measured" in amx.notes[0]
    avx512 = table_for_isa(tables, "avx512")
    assert avx512.isa == "avx512_bf16" and avx512.notes == (
        "no avx512 kernel table: every system priced with the avx512_bf16 table (nearest measured to avx512)",)
    only_avx2 = table_for_isa({"avx2": tables["avx2"]}, "amx")     # the last resort, still named
    assert only_avx2.isa == "avx2" and "priced with the avx2 table" in only_avx2.notes[0]


def test_a_system_missing_from_its_isas_table_takes_its_nearest_row_and_says_so(tmp_path):
    write_table(tmp_path, "avx2", scale=1.0)
    write_table(tmp_path, "avx512_bf16", systems=("ostinato", "ggml"), scale=2.0)   # kt-kernel not measured there
    tables = load_kernel_tables(tmp_path)
    t = table_for_isa(tables, "avx512_bf16")
    assert t.of("kt-kernel") == tables["avx2"].of("kt-kernel") and t.of("ggml") == tables["avx512_bf16"].of("ggml")
    assert t.notes == ("kt-kernel has no avx512_bf16 row: priced with its avx2 row (nearest measured to avx512_bf16)",)
    assert table_for_isa(tables, "avx2").notes == ()


def test_every_isa_has_a_fallback_order_over_the_others():
    assert set(NEAREST) == set(ISAS)
    for isa, order in NEAREST.items():
        assert sorted(order) == sorted(set(ISAS) - {isa}), isa


def test_one_table_file_prices_every_box_and_says_so_where_its_isa_differs(tmp_path):
    path = write_table(tmp_path, "avx2")
    assert kernels_for(path, "avx2").notes == ()
    other = kernels_for(path, "amx")
    assert other.isa == "avx2" and other.notes == (
        "the box is amx: priced with cpu_expert_kernels.avx2.yaml, measured at avx2, as given",)


@pytest.mark.parametrize("change, message", [
    ({"isa": "sse4"}, r"x.avx2.yaml: field 'isa': 'sse4' is not one of"),
    ({"isa": None}, r"x.avx2.yaml: field 'isa': 'None' is not one of"),
    ({"read_bandwidth": "fast"}, r"x.avx2.yaml: field 'read_bandwidth': 'fast'"),
    ({"tokens_per_expert": [1.0, 4.0]}, r"x.avx2.yaml: field 'systems.ostinato.per_core' against 'tokens_per_expert'"),
    ({"systems": {"ggml": {"per_core": [1.0, 1.0, 1.0]}}}, r"x.avx2.yaml: field 'systems': needs an 'ostinato' row"),
    ({"systems": {"ostinato": {"per_core": [1.0, "x", 1.0]}}}, r"x.avx2.yaml: field 'systems.ostinato.per_core'"),
    ({"systems": {"ostinato": {"rates": [1.0]}}}, r"x.avx2.yaml: field 'systems.ostinato.per_core' is missing"),
    ({"systems": []}, r"x.avx2.yaml: field 'systems'"),
])
def test_a_malformed_table_is_refused_by_file_and_field(tmp_path, change, message):
    path = write_table(tmp_path, "avx2", name="x.avx2.yaml", changes=change)
    with pytest.raises(ValueError, match=message):
        load_kernel_table(path)


def test_a_missing_field_and_a_file_named_for_another_isa_are_refused(tmp_path):
    path = write_table(tmp_path, "avx2")
    data = yaml.safe_load(path.read_text())
    del data["cores"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"cpu_expert_kernels.avx2.yaml: field 'cores' is missing"):
        load_kernel_table(path)
    path.unlink()
    write_table(tmp_path, "avx2", name="cpu_expert_kernels.avx512.yaml")
    with pytest.raises(ValueError, match=r"cpu_expert_kernels.avx512.yaml: field 'isa' is 'avx2', but the file is "
                                         r"named for 'avx512'"):
        load_kernel_tables(tmp_path)
    (tmp_path / "cpu_expert_kernels.avx512.yaml").rename(tmp_path / "cpu_expert_kernels.neon.yaml")
    with pytest.raises(ValueError, match=r"cpu_expert_kernels.neon.yaml: its name's ISA 'neon'"):
        load_kernel_tables(tmp_path)
    (tmp_path / "cpu_expert_kernels.neon.yaml").unlink()
    with pytest.raises(ValueError, match="no kernel tables"):
        load_kernel_tables(tmp_path)


def test_the_committed_tables_price_each_box_by_its_isa():
    """avx2 and avx512_bf16 are measured (an AVX2 Zen 3 and an AVX-512 Zen 4): the AVX2 box gets the avx2 table,
    the AVX-512 boxes and the AMX presets the avx512_bf16 one, each stand-in stated."""
    tables = load_kernel_tables(KERNEL_TABLES)
    assert {"avx2", "avx512_bf16"} <= set(tables)
    for isa, t in tables.items():
        assert t.isa == isa and {OURS, "ggml"} <= set(t.systems), isa
    boxes = {p.stem: load_hardware(p).host.isa for p in (*PRESETS.glob("*.yaml"), *BOXES_DIR.glob("*.yaml"))}
    assert boxes["epyc7452x2"] == "avx2" and boxes["rtx4090d-x4"] == "amx"
    for box, isa in boxes.items():
        t = kernels_for(KERNEL_TABLES, isa)
        expected = isa if isa in tables else NEAREST[isa][0]
        assert t.isa == expected, box
        if isa == "amx" and "amx" not in tables:
            assert any("AMX is not measured" in n for n in t.notes), box
        assert bool(t.notes) == (isa not in tables or set(t.systems) != set(tables[isa].systems)), box


def test_the_side_by_side_tool_writes_the_table_of_the_isa_it_built(monkeypatch):
    """--out defaults to the --isa's table, and kt-kernel's child process loads that ISA's extension."""
    got = {}
    monkeypatch.setattr(ks, "run", lambda args: got.update(vars(args)) or 0)
    monkeypatch.delenv("KT_KERNEL_CPU_VARIANT", raising=False)
    assert ks.main(["--isa", "avx2"]) == 0
    assert got["out"] == str(table_file("avx2"))
    import os
    assert os.environ["KT_KERNEL_CPU_VARIANT"] == "avx2"
    monkeypatch.setenv("KT_KERNEL_CPU_VARIANT", "avx2")
    assert ks.main(["--isa", "avx2", "--clock", "cpu"]) == 0 and got["out"] == ""


def test_the_documented_kernel_tables_are_the_committed_tables():
    """docs/benchmarks.md shows every committed table as kernel_table_doc renders it, figure for figure."""
    from ostinato.bench import kernel_table_doc as doc

    page = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    tables = doc.committed_tables()
    assert {p.name for p in tables} >= {"cpu_expert_kernels.avx2.yaml", "cpu_expert_kernels.avx512_bf16.yaml"}
    for path in tables:
        data = yaml.safe_load(path.read_text())
        begin, end = doc.DOC_BEGIN.format(data["isa"]), doc.DOC_END.format(data["isa"])
        assert begin in page and end in page, f"docs/benchmarks.md has no block for {path.name}"
        shown = page[page.index(begin) + len(begin):page.index(end)].strip()
        assert shown == doc.render(data), f"docs/benchmarks.md's {data['isa']} block is not {path.name}: rerun " \
                                          "python -m ostinato.bench.kernel_table_doc --doc"


def test_a_rendered_table_judges_the_kernel_goal_shape_by_shape(tmp_path):
    """The goal column asks 1.1x at uniform calls of up to 8 tokens, 1.0x elsewhere, and the count says where
    ours meets it against each other system."""
    from ostinato.bench import kernel_table_doc as doc

    assert [doc.goal_for(s) for s in ("uniform n=1", "uniform n=8", "uniform n=16", "grouped n=512 t=16")] == \
        [1.1, 1.1, 1.0, 1.0]
    data = {"source": "hand", "cpu": "test", "isa": "avx2", "cores": 1, "read_bandwidth": 2e10,
            "expert_bytes": 100, "layer_experts": 256, "top_k": 6,
            "shapes": ["uniform n=1", "uniform n=8", "uniform n=64", "grouped n=512 t=64"],
            "tokens_per_expert": [1.0, 1.1, 1.9, 64.0],
            "systems": {"ostinato": {"per_core": [1.09e9, 1.2e9, 0.99e9, 2e9], "driven": "ours"},
                        "ggml": {"per_core": [1e9] * 4, "driven": "theirs"}}}
    text = doc.render(data)
    assert "| uniform n=1 | 1.00 | 1.09 | 1.00 | 1.09x | 1.1x |" in text
    assert "met at 2 of 4 shapes against ggml" in text  # n=1 at 1.09x and n=64 at 0.99x miss
    page = tmp_path / "page.md"
    page.write_text("# page\n")
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    doc.write_doc(page, [tmp_path / "t.yaml"])
    doc.write_doc(page, [tmp_path / "t.yaml"])  # rewriting replaces the block, never adds a second
    assert page.read_text().count(doc.DOC_BEGIN.format("avx2")) == 1 and text in page.read_text()
