"""The cold kernel's threads: the plan's count, clamped to this machine, with cores kept for a GPU's threads."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import IDS, _variant

from ostinato import buckets
from ostinato.runtime.cli import run as run_cli
from ostinato.runtime.engine import executor as executor_module
from ostinato.runtime.engine.cpu_threads import GPU_RESERVED, cpu_threads, usable_cores
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.kernels import cold_task
from ostinato.runtime.kernels.cold_task import ColdBridge


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


def test_decode_calls_get_the_plans_decode_threads_within_the_clamped_pool():
    assert cpu_threads(96, cuda=True, cores=16, decode=18).decode == 14   # the machine's pool is smaller still
    assert cpu_threads(96, cuda=True, cores=64, decode=18).decode == 18
    assert cpu_threads(96, cuda=True, cores=64).decode == 62              # an older plan: the whole pool
    assert cpu_threads(96, cuda=True, cores=64, decode=18).describe() == (
        "cpu threads 62, 18 in decode steps (plan: 96; clamped to this machine's 64 cores less 2 for the launching "
        "and CUDA host-function threads)")


def _decoding(engine, steps: int = 4):
    """Logits of a prefill of 20 tokens and `steps` decode steps fed IDS's next tokens: [20 + steps, V]."""
    s = engine.new_session()
    out = [s.prefill(IDS[:20])]
    for i in range(steps):
        out.append(s.decode(int(IDS[20 + i])).reshape(1, -1))
    return torch.cat(out)


@pytest.mark.slow  # the compiled plan (tests/conftest.py) and two engines
@pytest.mark.parametrize("cpu_step", ["eager", "compiled"])
def test_decode_passes_the_planned_threads_prefill_every_thread_and_the_logits_do_not_change(
        compiled, tiny_ckpt, monkeypatch, cpu_step):
    """The cold kernel receives policy.decode_cpu_threads in decode-sized calls (the eager step's cold task node,
    the compiled step's host tasks) and the whole pool in prefill's; its results do not depend on its threads."""
    if usable_cores() < 2:
        pytest.skip("one core: the pool and the decode threads cannot differ")
    # the compiled engines build the plan context's step only, the one tests/test_cpu_step.py builds for this mixed
    # plan (threads are not in the graph: Inductor's cache has it); positions 0..24 need no other context
    monkeypatch.setattr(buckets, "DECODE_CONTEXT_SMALLEST", 1 << 30)
    plan = _variant(compiled[0], "mixed", None)
    one = plan.replace(policy=plan.policy.replace(cpu_threads=2, decode_cpu_threads=1))
    every = plan.replace(policy=plan.policy.replace(cpu_threads=2, decode_cpu_threads=None))
    calls = []  # (what, tokens, n_threads) of every cold-kernel call
    run_task = ColdBridge._run_task
    monkeypatch.setattr(ColdBridge, "_run_task",
                        lambda self, task: (calls.append(("step", task.T, task.n_threads)), run_task(self, task))[1])

    def host_task(kernel, x, ids, w, row_of, table, out, n_threads, what):
        calls.append(("host", x.shape[0], n_threads))
        return cold_task.run_on_host(kernel, x, ids, w, row_of, table, out, n_threads, what)

    monkeypatch.setattr(executor_module, "run_on_host", host_task)
    monkeypatch.setattr(executor_module, "MIN_TASK_BYTES_PER_THREAD", 1)  # the tiny experts would get 1 thread anyway
    logits = {}
    for name, p in (("one", one), ("every", every)):
        e = load_engine(p, tiny_ckpt, device="cpu", cpu_step=cpu_step)
        assert (e.cpu_threads.threads, e.cpu_threads.decode) == (2, 1 if name == "one" else 2)
        assert e.step_runner.cpu_step == cpu_step, e.step_runner.cpu_step_note  # the step asked for, not a fallback
        kernel_call = type(e.executor.cpu_kernel).__call__
        monkeypatch.setattr(type(e.executor.cpu_kernel), "__call__", lambda self, x, routes, experts, out, n=1: (
            calls.append(("prefill", x.shape[0], n)), kernel_call(self, x, routes, experts, out, n))[1])
        calls.clear()
        logits[name] = _decoding(e)
        monkeypatch.setattr(type(e.executor.cpu_kernel), "__call__", kernel_call)
        prefill = [c for c in calls if c[1] == 20]
        decode = [c for c in calls if c[1] == 1]
        assert prefill and all(c == ("prefill", 20, 2) for c in prefill)   # the whole pool
        assert decode and {c[2] for c in decode} == {1 if name == "one" else 2}
        assert len(prefill) + len(decode) == len(calls)
        if e.step_runner.cpu_step == "compiled":   # its decode calls are the host tasks of host_decode_step
            assert {c[0] for c in decode} == {"host"}
    assert torch.equal(logits["one"], logits["every"])   # bit for bit: the kernel's sums do not depend on threads


@pytest.mark.slow  # the compiled plan (tests/conftest.py)
def test_batched_decode_steps_get_the_decode_threads_and_prefill_buckets_the_whole_pool(compiled, tiny_ckpt):
    """Each fixed-shape step's cold task (one per token count, its threads fixed for a captured graph): the decode
    step and the batched ones of up to `parallel` sessions on the plan's decode threads, larger buckets not."""
    if usable_cores() < 2:
        pytest.skip("one core: the pool and the decode threads cannot differ")
    plan = _variant(compiled[0], "mixed", None)
    plan = plan.replace(policy=plan.policy.replace(cpu_threads=2, decode_cpu_threads=1, prefill_buckets=[2, 4, 8],
                                                      sessions=3))
    e = load_engine(plan, tiny_ckpt, device="cpu", cpu_step="eager", parallel=3)
    bridges = [b for b in e.executor.bridges if b is not None]
    assert bridges
    for bridge in bridges:
        assert {T: task.n_threads for T, task in bridge.tasks.items()} == {1: 1, 2: 1, 3: 1, 4: 2, 8: 2}
