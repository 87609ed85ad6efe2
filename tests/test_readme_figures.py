"""Every plan figure README.md and docs/ show is the tool's output (python -m ostinato.bench.readme_figures):
regenerated here from the committed plans and the compiler, and compared with what the files hold."""

import shutil

import pytest

from ostinato.bench import readme_figures as figures

STALE = "stale: run python -m ostinato.bench.readme_figures --doc"
QUICK = [b for b in figures.BLOCKS if b.render is not figures.flash_cpu_only]  # read committed plans only


@pytest.mark.parametrize("block", QUICK, ids=lambda b: b.name)
def test_the_plan_figures_shown_are_the_tools(block):
    shown = figures.shown((figures.ROOT / block.file).read_text(), block)
    assert shown is not None, f"{block.file} has no '{block.name}' block"
    assert shown == block.render(), f"{block.file}: '{block.name}' is {STALE}"


@pytest.mark.slow  # compiles V4-Flash three times for a cpu-only host
def test_the_cpu_only_figures_shown_are_the_compilers():
    block = next(b for b in figures.BLOCKS if b.render is figures.flash_cpu_only)
    assert figures.shown((figures.ROOT / block.file).read_text(), block) == block.render(), STALE


def test_the_figures_are_those_of_the_committed_plan():
    """What the blocks say, read back from the plan itself (not from the tool's own arithmetic)."""
    plan = figures._flash_plan()
    p = plan.predictions
    said = figures.flash_predictions()
    assert f"{p.hot_route_share:.1%} of routes on hot experts, {p.decode_tokens_per_s:.1f} decode tok/s" in said
    assert f"a {p.wait_after_tool_output_120_tokens_ms:.0f} ms wait" in said
    table = figures.flash_memory_table()
    hot = sum(len(layer.hot_experts) for layer in plan.layers)
    assert f"{hot:,d} in all + {len(plan.mtp.hot_experts)} of the MTP block's" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and "GiB" not in line and "total" not in line]
    assert len(rows) == len({k for d in plan.memory if d.device != "host" for k, v in d.components.items() if v})
    host = next(d for d in plan.memory if d.device == "host")
    assert f"{host.components['cold_experts'] // plan.model.expert_bytes:,d} experts" in figures.flash_host()


def test_a_figure_that_drifts_is_found(tmp_path, monkeypatch, capsys):
    for block in QUICK:  # a copy of the files that show the figures
        (tmp_path / block.file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(figures.ROOT / block.file, tmp_path / block.file)
    monkeypatch.setattr(figures, "BLOCKS", tuple(QUICK))
    assert figures.main(["--check"], docs=tmp_path) == 0
    readme = tmp_path / "README.md"
    decode = f"{figures._flash_plan().predictions.decode_tokens_per_s:.1f} decode tok/s"
    readme.write_text(readme.read_text().replace(decode, "58.0 decode tok/s"))  # a hand edit
    assert figures.main(["--check"], docs=tmp_path) == 1
    assert "README.md: 'V4-Flash plan predictions'" in capsys.readouterr().err
    assert figures.main(["--doc"], docs=tmp_path) == 0 and figures.main(["--check"], docs=tmp_path) == 0
    assert decode in readme.read_text()
