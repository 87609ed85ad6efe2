"""compiler/compile.py's shape: one module per pass under compiler/passes/, and the re-plan loop in compile_plan."""

from __future__ import annotations

import logging
from pathlib import Path

from ostinato.compiler import compile as pipeline
from ostinato.compiler import passes

PASSES_DIR = Path(passes.__file__).parent


def test_each_pass_has_its_own_module_and_the_map_names_every_module():
    for p in pipeline.PASSES:
        assert p.__module__ == f"ostinato.compiler.passes.{p.__name__}", p.__name__
    modules = sorted(f.name for f in PASSES_DIR.glob("*.py") if f.name != "__init__.py")
    mapped = sorted(line.split()[0] for line in passes.__doc__.splitlines()  # "    name.py    what it holds"
                    if line.startswith("    ") and line.split()[0].endswith(".py"))
    assert mapped == modules


def test_a_pass_that_returns_why_runs_the_placement_passes_again_in_order(monkeypatch, caplog):
    ran = []

    def pass_named(name, returns=None):
        def p(b):
            ran.append(name)
            return returns
        p.__name__ = name
        return p

    monkeypatch.setattr(pipeline, "PASSES", (pass_named("first"), pass_named("asks", "(because)"), pass_named("last")))
    monkeypatch.setattr(pipeline, "PLACE", (pass_named("fit"), pass_named("price")))
    told = []
    with caplog.at_level(logging.INFO, logger="ostinato.compile"):
        pipeline.compile_plan(None, told.append)
    assert ran == ["first", "asks", "fit", "price", "last"]
    assert told == ["first", "asks", "last"]  # the progress bar counts the listed passes only
    assert [r.getMessage() for r in caplog.records] == [
        "pass first", "pass asks", "pass asks: fit (because)", "pass asks: price (because)", "pass last"]


def test_the_placement_passes_are_the_ones_memory_placement_cost_model_shard_copy_buckets():
    assert [p.__name__ for p in pipeline.PLACE] == ["memory", "placement", "cost_model", "shard_copy", "buckets"]
    names = [p.__name__ for p in pipeline.PASSES]
    assert names[names.index("memory"):names.index("buckets") + 1] == [p.__name__ for p in pipeline.PLACE]
