"""Hardware specs: presets load; every bad field is named."""

import pytest
import yaml

from ostinato.compiler.hardware import HardwareError, available_presets, load_hardware, parse_hardware


def test_presets():
    assert {"rtx4090d-x4", "h200-x1", "cpu-only"} <= set(available_presets())
    hw = load_hardware("rtx4090d-x4")
    assert hw.gpu.count == 4 and hw.gpu.usable_bytes < 24 * 1024**3 and hw.link.h2d_bandwidth == 25e9
    assert load_hardware("cpu-only").cpu_only and not hw.cpu_only
    assert len(hw.source_sha256) == 64


def _spec():
    return yaml.safe_load(load_hardware.__globals__["plans_dir"]().joinpath("hardware", "h200-x1.yaml").read_text())


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["gpus"].pop("count"), "gpus.count"),
    (lambda d: d["gpus"].update(count=0), "gpus.count"),
    (lambda d: d["gpus"].update(bandwidth="fast"), "gpus.bandwidth"),
    (lambda d: d["host"].update(isa="sse2"), "host.isa"),
    (lambda d: d["link"].update(h2d_bandwidth=-1), "link.h2d_bandwidth"),
    (lambda d: d.update(link=[1, 2]), "link"),
    (lambda d: d.update(cpu_only="yes"), "cpu_only"),
])
def test_errors_name_the_field(edit, field):
    d = _spec()
    edit(d)
    with pytest.raises(HardwareError, match=f"my.yaml: field '{field}'"):
        parse_hardware(d, "my.yaml")


def test_unknown_preset_lists_the_presets():
    with pytest.raises(HardwareError, match="not a preset .*rtx4090d-x4"):
        load_hardware("rtx9090-x8")
