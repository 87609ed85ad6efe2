"""ostinato-calibrate refuses bad input before building or timing anything."""

from __future__ import annotations

import pytest

from ostinato.compiler.cli import calibrate


def test_an_unknown_base_spec_is_refused_by_name(tmp_path, capsys):
    assert calibrate.main(["no-such-box", str(tmp_path / "out.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ostinato-calibrate: error:") and "no-such-box" in err
    assert not (tmp_path / "out.yaml").exists()


def test_an_output_that_is_a_directory_is_refused(tmp_path, capsys):
    assert calibrate.main(["cpu-only", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["cpu-only", "o.yaml", "--experts", "4"], "--experts must be at least 12, got 4"),
    (["cpu-only", "o.yaml", "--threads", "0"], "--threads must be positive, got 0"),
    (["cpu-only", "o.yaml", "--dtype", "fp8"], "invalid choice: 'fp8'"),
])
def test_usage_errors_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        calibrate.main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_this_hosts_memory_is_memtotal_or_a_containers_lower_limit(tmp_path):
    meminfo, cgroup = tmp_path / "meminfo", tmp_path / "memory.max"
    meminfo.write_text("MemTotal:       24576000 kB\nMemFree:        1000 kB\n")
    assert calibrate.host_memory_bytes(meminfo, tmp_path / "absent") == 24576000 * 1024
    cgroup.write_text("max\n")  # no limit
    assert calibrate.host_memory_bytes(meminfo, cgroup) == 24576000 * 1024
    cgroup.write_text(f"{8 * 2**30}\n")
    assert calibrate.host_memory_bytes(meminfo, cgroup) == 8 * 2**30
    assert calibrate.host_memory_bytes(tmp_path / "no-meminfo", cgroup) is None


def test_a_calibrated_cpu_only_spec_gives_its_device_the_hosts_memory():
    from ostinato.hardware import load_hardware

    spec = calibrate.with_host_memory(load_hardware("cpu-only"), 256 * 2**30)
    assert spec.host.usable_bytes == 224 * 2**30 and spec.gpus.usable_bytes == 224 * 2**30  # 7/8, one memory
    gpus = calibrate.with_host_memory(load_hardware("rtx4090d-x4"), 256 * 2**30)
    assert gpus.host.usable_bytes == 224 * 2**30 and gpus.gpus == load_hardware("rtx4090d-x4").gpus  # cards keep theirs
    small = calibrate.with_host_memory(load_hardware("cpu-only"), 3 * 2**30 + 12345)  # below the preset's 4 GiB device
    assert small.gpus.usable_bytes == small.host.usable_bytes == int((3 * 2**30 + 12345) * 7 / 8) // 2**20 * 2**20
