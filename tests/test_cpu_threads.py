"""The cold kernel's threads: the plan's count, clamped to this machine, with cores kept for a GPU's threads."""

from __future__ import annotations

import pytest

from ostinato.runtime.cli import run as run_cli
from ostinato.runtime.engine.cpu_threads import GPU_RESERVED, cpu_threads, usable_cores


def test_an_h200_plan_on_a_16_core_box_leaves_two_cores_free():
    t = cpu_threads(96, cuda=True, cores=16)
    assert t.threads == 16 - GPU_RESERVED == 14
    assert t.describe() == ("cpu threads 14 (plan: 96; clamped to this machine's 16 cores less 2 for the "
                            "launching and CUDA host-function threads)")


def test_cpu_only_runs_keep_every_core_and_small_boxes_keep_one_thread():
    assert cpu_threads(2, cuda=False, cores=2).describe() == "cpu threads 2"
    assert cpu_threads(8, cuda=False, cores=2).threads == 2
    assert cpu_threads(96, cuda=True, cores=2).threads == 1


@pytest.mark.slow  # the compiled plan (tests/conftest.py)
def test_the_run_header_says_the_plan_was_clamped(compiled, capsys):
    plan, work = compiled
    many = usable_cores() + 94
    oversized = plan.replace(policy=plan.policy.replace(cpu_threads=many))
    oversized.write(work / "oversized.yaml")  # beside the plan: its relative paths still hold
    rc = run_cli.main([str(work / "oversized.yaml"), "--device", "cpu", "--prompt", "hi", "--max-new", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"cpu threads {usable_cores()} (plan: {many}; clamped to this machine's {usable_cores()} cores)" in out
