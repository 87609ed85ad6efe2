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
