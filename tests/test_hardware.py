"""Hardware specs: presets load; every bad field is named."""

import pytest
import yaml

from ostinato.hardware import HardwareError, available_presets, load_hardware, parse_hardware


def test_presets():
    assert {"rtx4090d-x4", "h200-x1", "cpu-only"} <= set(available_presets())
    hw = load_hardware("rtx4090d-x4")
    assert hw.gpus.count == 4 and hw.gpus.usable_bytes < 24 * 1024**3 and hw.link.h2d_bandwidth == 25e9
    assert load_hardware("cpu-only").cpu_only and not hw.cpu_only
    assert len(hw.sha256) == 64 and hw.sha256 != load_hardware("h200-x1").sha256


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
    (lambda d: d["host"].update(cores="two"), "host.cores"),
    (lambda d: d["host"].update(cores=2.5), "host.cores"),
    (lambda d: d["gpus"].update(count=True), "gpus.count"),
    (lambda d: d.update(cpu_onyl=True), "cpu_onyl"),           # misspelled: refused, not a silent default
    (lambda d: d["gpus"].update(bandwith=1e12), "gpus.bandwith"),
])
def test_errors_name_the_field(edit, field):
    d = _spec()
    edit(d)
    with pytest.raises(HardwareError, match=f"my.yaml: field '{field}'"):
        parse_hardware(d, "my.yaml")


def test_unknown_preset_lists_the_presets():
    with pytest.raises(HardwareError, match="not a preset .*rtx4090d-x4"):
        load_hardware("rtx9090-x8")


def test_numbers_in_any_yaml_spelling_and_optional_fields(tmp_path):
    text = (load_hardware.__globals__["plans_dir"]() / "hardware" / "h200-x1.yaml").read_text()
    d = yaml.safe_load(text)
    d.pop("description")
    body = yaml.safe_dump(d).replace(f"bandwidth: {d['gpus']['bandwidth']!r}", "bandwidth: 4.8e12")
    body = body.replace(f"usable_bytes: {d['gpus']['usable_bytes']}", "usable_bytes: 130e9", 1)
    assert "4.8e12" in body and "130e9" in body  # YAML 1.1 reads both as strings; specs read them as numbers
    (tmp_path / "mine.yaml").write_text(body)
    hw = load_hardware(tmp_path / "mine.yaml")
    assert hw.gpus.bandwidth == 4.8e12 and hw.gpus.usable_bytes == 130_000_000_000 and hw.description == ""


def test_unknown_field_lists_the_known_ones():
    d = _spec()
    d["host"]["isa_"] = "avx2"
    with pytest.raises(HardwareError, match=r"field 'host.isa_' is not a known field \(known fields here: cores, "):
        parse_hardware(d, "my.yaml")


def test_a_cpu_only_device_is_a_part_of_the_host_memory():
    d = yaml.safe_load(load_hardware.__globals__["plans_dir"]().joinpath("hardware", "cpu-only.yaml").read_text())
    d["gpus"].update(count=2, usable_bytes=d["host"]["usable_bytes"] // 2)  # all of it: fine
    hw = parse_hardware(d, "mine.yaml")
    assert [hw.device_name(g) for g in range(2)] == ["cpu0", "cpu1"]
    d["gpus"]["usable_bytes"] += 1
    with pytest.raises(HardwareError, match=r"mine.yaml: field 'gpus.usable_bytes': a cpu-only spec's device is the "
                                            r"host itself.*2 x 8,589,934,593 bytes is more than host.usable_bytes "
                                            r"\(17,179,869,184\)"):
        parse_hardware(d, "mine.yaml")
    assert load_hardware("cpu-only").device_name(0) == "cpu" and load_hardware("h200-x1").device_name(0) == "gpu0"
    gpus = _spec()  # with GPUs the device memory is their own, whatever the host has
    gpus["host"]["usable_bytes"] = 1
    assert parse_hardware(gpus, "h200.yaml").gpus.usable_bytes > 1
