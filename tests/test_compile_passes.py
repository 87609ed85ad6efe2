"""The compile pipeline as a visible list of passes; the buckets as the build's result; their rule in the schema."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from ostinato.compiler import compile as pipeline
from ostinato.compiler.compile import CompileError, CompileOptions, compile_plan
from ostinato.plan import PlanError, load_plan

REPO = Path(__file__).resolve().parents[1]
FLASH_CONFIG = REPO / "plans" / "models" / "deepseek-v4-flash"
FLASH_PLAN = REPO / "plans" / "deepseek-v4-flash.rtx4090d-x4.yaml"


def test_the_docstring_lists_the_passes_in_the_order_they_run():
    names = [p.__name__ for p in pipeline.PASSES]
    listed = " ".join(pipeline.__doc__.split("\n\n")[1].split()).replace("-> ", "").split()
    assert listed == names
    assert names.index("buckets") < names.index("replan") < names.index("policy") < names.index("kernels")


def test_every_pass_is_logged_and_the_buckets_are_the_builds(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="ostinato.compile"):
        b = compile_plan(CompileOptions(FLASH_CONFIG, tmp_path / "plan.yaml", "rtx4090d-x4", profile="synthetic:0.9"))
    logged = [r.getMessage() for r in caplog.records]
    assert ([m for m in logged if m.startswith("pass ") and ":" not in m]
            == [f"pass {p.__name__}" for p in pipeline.PASSES])
    assert b.buckets and b.plan.policy.prefill_buckets == b.buckets
    assert not hasattr(b.cost, "buckets")  # the cost model prices buckets it is given; it holds none
    # the replan pass left the graph-pool reserve at the largest bucket kept
    assert b.bucket_reserve == max(b.buckets)
    assert b.plan.policy == b.execution


def _flash_plan_with(tmp_path, **policy) -> Path:
    data = yaml.safe_load(FLASH_PLAN.read_text())
    data["policy"].update(policy)
    data["model"]["path"] = str(FLASH_CONFIG)
    out = tmp_path / "plan.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize("buckets, says", [
    ([2, 3], "prefill bucket 3 is not a power of two >= 2"),
    ([1, 2], "prefill bucket 1 is not a power of two >= 2"),
    ([2, 131072], "prefill bucket 131072: buckets are powers of two from 2 up to context / 3 (87381"),
    ([4, 2], "prefill buckets [4, 2]: ascending, each once"),
    ([2, 2], "prefill buckets [2, 2]: ascending, each once"),
])
def test_the_plan_schema_refuses_buckets_that_break_the_rule(tmp_path, buckets, says):
    with pytest.raises(PlanError) as e:
        load_plan(_flash_plan_with(tmp_path, prefill_buckets=buckets))
    assert "field 'policy.prefill_buckets'" in str(e.value) and says in str(e.value)


def test_the_committed_plans_buckets_pass_the_schema(tmp_path):
    committed = yaml.safe_load(FLASH_PLAN.read_text())["policy"]["prefill_buckets"]
    assert committed and load_plan(_flash_plan_with(tmp_path)).policy.prefill_buckets == committed


def test_given_buckets_are_checked_by_the_schema_before_kernels_are_built(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(pipeline, "kernels", lambda b: built.append(b))
    monkeypatch.setattr(pipeline, "PASSES", tuple(pipeline.kernels if p.__name__ == "kernels" else p
                                                 for p in pipeline.PASSES))
    with pytest.raises(CompileError,
                       match=r"prefill bucket 64: buckets are powers of two from 2 up to context / 3 \(42"):
        compile_plan(CompileOptions(FLASH_CONFIG, tmp_path / "plan.yaml", "rtx4090d-x4", context=128,
                                    prefill_buckets=(2, 64)))
    assert built == []


def test_the_command_line_checks_the_buckets_shape_with_the_schemas_rule():
    import argparse

    from ostinato.buckets import bucket_rule_error
    from ostinato.compiler.cli.compile import _buckets

    assert _buckets("8,2,4") == (8, 2, 4) and _buckets("none") == ()
    with pytest.raises(argparse.ArgumentTypeError) as e:
        _buckets("8,12")
    assert str(e.value) == bucket_rule_error([8, 12], 10 ** 6) == "prefill bucket 12 is not a power of two >= 2"


def test_every_gpu_counts_the_cublas_workspaces_of_its_two_matmul_streams(tmp_path, tiny_ckpt):
    """cuBLAS allocates a workspace per stream it runs on (32 MiB on sm_90): the default stream's and the
    capture stream's on every GPU; a cpu-only plan has none."""
    from ostinato.compiler.memory_model import CUBLAS_STREAMS, CUBLAS_WORKSPACE_BYTES

    for model, hardware, want in ((FLASH_CONFIG, "rtx4090d-x4", CUBLAS_STREAMS * CUBLAS_WORKSPACE_BYTES),
                                  (tiny_ckpt, "cpu-only", None)):
        plan = compile_plan(CompileOptions(model, tmp_path / f"{hardware}.yaml", hardware, context=512,
                                           build_kernels=False)).plan
        gpus = [m for m in plan.memory if m.device.startswith("gpu")]
        assert gpus and all(m.components.get("cublas_workspaces") == want for m in gpus), hardware
    assert want is None and CUBLAS_STREAMS * CUBLAS_WORKSPACE_BYTES == 64 * 2**20
