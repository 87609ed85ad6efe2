"""The dependency rule: compiler -> core <- runtime <- server, never compiler <-> runtime; the core imports no
side; nothing in the product imports the server (a leaf), and nothing in the product imports bench (which may
import every side).

Every import statement of every module is read from source (function-level imports included: a late
import is still a dependency), resolved to an absolute module name, and checked against the rule.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# folder -> (package it is mapped to, what it must never import)
SIDES = {
    "ostinato": ("ostinato", ("ostinato.compiler", "ostinato.runtime", "ostinato.server", "ostinato.bench")),
    "compiler": ("ostinato.compiler", ("ostinato.runtime", "ostinato.server", "ostinato.bench", "transformers")),
    "runtime": ("ostinato.runtime", ("ostinato.compiler", "ostinato.server", "ostinato.bench", "jinja2",
                                     "transformers")),
    "server": ("ostinato.server", ("ostinato.compiler", "ostinato.bench", "jinja2", "transformers")),
    "bench": ("ostinato.bench", ()),
    # package data with a locator module: nothing of any side
    "plans": ("ostinato.plans", ("ostinato.compiler", "ostinato.runtime", "ostinato.server", "ostinato.bench")),
    "templates": ("ostinato.templates", ("ostinato.compiler", "ostinato.runtime", "ostinato.server",
                                         "ostinato.bench")),
}
# Folders that are no package but still must not reach into benchmarks or the server by path tricks.
SCRIPTS = ("tools",)


def imports_of(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file at `path`, a module of `package`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            out.append((node.lineno, module))
            out += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]  # `from pkg import sub`
    return out


def violations(folder: Path, package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        parts = list(rel.parts[:-1]) + ([] if rel.name == "__init__.py" else [rel.stem])
        module_package = ".".join([package] + list(rel.parts[:-1]))
        bad = {}
        for line, module in imports_of(path, module_package):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                bad.setdefault(line, module)
        found += [f"{path.relative_to(folder.parent)}:{line} ({'.'.join([package] + parts)}) imports {module}"
                  for line, module in sorted(bad.items())]
    return found


@pytest.mark.parametrize("folder", sorted(SIDES))
def test_each_side_imports_only_what_the_rule_allows(folder):
    package, forbidden = SIDES[folder]
    assert violations(REPO / folder, package, forbidden) == []


def test_every_top_level_package_is_covered():
    """Every folder pyproject.toml maps into the package has a rule here (a new one must get one)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert {folder: package for package, folder in package_dir.items()} == {f: s[0] for f, s in SIDES.items()}


def test_scripts_do_not_edit_the_import_path():
    """tools/ holds scripts a developer runs; they import the installed package, never siblings by sys.path."""
    found = [f"{path.relative_to(REPO)}:{n}" for folder in SCRIPTS for path in sorted((REPO / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if "sys.path.insert" in line
             or "sys.path.append" in line]
    assert found == []


def test_the_walker_sees_relative_late_and_absolute_imports(tmp_path):
    side = tmp_path / "compiler"
    (side / "deep").mkdir(parents=True)
    (side / "ok.py").write_text("from ostinato.plan import Plan\nfrom . import placement\n")
    (side / "deep" / "late.py").write_text("def f():\n    from ...runtime.engine import loader\n")
    (side / "abs.py").write_text("import ostinato.runtime.model\n")
    (side / "pkg.py").write_text("from ostinato import runtime\n")
    found = violations(side, "ostinato.compiler", ("ostinato.runtime",))
    assert [f.split(" ")[0] for f in found] == ["compiler/abs.py:1", "compiler/deep/late.py:2", "compiler/pkg.py:1"]
