"""The CPU expert pool's threads for decode-sized calls (issue #58, "Many cores": compiler/cost_model/pool_threads.py).

A decode step's few cold experts need only the threads that read them at the memory's rate; past that every thread
adds hand-off (ostinato/host_sync.py's bound, 4 x 163.5 ns a thread). The expected choice is written out from the
spec here (the smallest T whose per-core read reaches the host's expert read), not taken from the model; so is the
price it saves. Prefill-sized calls keep every core, and every price at every core is what it was.
"""

import copy
import math

import pytest
from test_cost_model_position import v4_cost

from ostinato.compiler.explain import explain
from ostinato.compiler.host_kernel import expert_read_bandwidth, kernel_time
from ostinato.host_sync import CHECK_INS_PER_CALL, PER_THREAD_S
from ostinato.plan import PlanError, load_plan


def saturating_threads(hw) -> int:
    """The fewest threads whose kernel reads experts at 1 token each as fast as the host's memory feeds them."""
    return math.ceil(expert_read_bandwidth(hw.host) / hw.host.expert_kernel.per_core[0])


@pytest.mark.parametrize("hardware", ["h200-x1", "rtx4090d-x4"])
def test_decode_runs_the_pool_on_the_threads_that_saturate_the_memory(hardware):
    cost = v4_cost(hardware, "fp8")   # every expert cold: 6 cold routes a layer, one token each
    cores, T = cost.hw.host.cores, saturating_threads(cost.hw)
    assert T < cores
    assert cost.choose_decode_threads() == T
    seconds = cost.decode_host_seconds()
    assert len(seconds) == cores and seconds[T - 1] == min(seconds)


def test_the_h200_decode_price_drops_by_the_hand_off_of_the_threads_it_no_longer_runs():
    every_core = v4_cost("h200-x1", "fp8")   # a model no policy set threads on: the old price, all 96 cores
    cores, T = every_core.hw.host.cores, every_core.choose_decode_threads()
    cost = every_core.with_decode_threads(T)
    assert every_core.decode_pool_threads is None and cost.decode_pool_threads == T
    assert every_core.decode_step() == every_core.with_decode_threads(cores).decode_step()
    # both pools read the layer's 6 experts at the memory's rate, so the kernel takes as long: the step saves
    # each layer's hand-off growth between T and 96 threads (every layer's cold side is its longer one here)
    saved = len(cost.layers) * CHECK_INS_PER_CALL * PER_THREAD_S * (cores - T)
    assert every_core.decode_step() - cost.decode_step() == pytest.approx(saved, rel=1e-9)
    assert every_core.batched_decode_step([None] * 4) > cost.batched_decode_step([None] * 4)
    assert every_core.mtp_draft() > cost.mtp_draft() and every_core.verify_step(2) > cost.verify_step(2)
    assert every_core.bucket_step(2) == cost.bucket_step(2)   # a prefill bucket keeps every core


def test_prices_at_every_core_are_unchanged():
    cost = v4_cost("h200-x1", "fp8")
    host = cost.hw.host
    for distinct, routes in [(1.0, 1.0), (6.0, 6.0), (40.0, 900.0)]:
        old = kernel_time(cost.host_kernel, host, distinct, routes, cost.expert_bytes)
        assert cost.host_experts_time(distinct, routes) == old
        assert cost.host_experts_time(distinct, routes, host.cores) == old
    assert cost.handoff_time() == cost.handoff_time(host.cores) == host.handoff_s
    # a prefill's layer (split_layer without threads) still pays the all-core hand-off
    first, gpu, cpu = cost.split_layer(5, 1)
    assert cpu == cost.cpu_experts_time(1, cost.distinct(5, 1, False), cost.routes(5, 1, False), host.cores)


def test_a_calibrated_host_prices_a_share_of_its_cores_at_that_share_of_its_rates():
    cost = v4_cost("h200-x1", "fp8")
    hw = cost.hw.model_copy(update={"host": cost.hw.host.model_copy(update={
        "expert_read_bandwidth": 2.0e11, "expert_flops": 5.0e12, "expert_kernel": None})})
    calibrated = copy.copy(cost)
    calibrated.hw, calibrated.host_kernel = hw, None
    full = calibrated.host_experts_time(6.0, 6.0)
    assert calibrated.host_experts_time(6.0, 6.0, 24) == pytest.approx(full * 96 / 24, rel=1e-12)
    with pytest.raises(ValueError, match="threads 97: the expert pool's threads on h200-x1, 1 to its 96 cores"):
        calibrated.host_experts_time(6.0, 6.0, 97)


@pytest.fixture(scope="module")
def h200_build(tiny_ckpt, tmp_path_factory, kernel_dir):
    """(the compile's build, its folder): the tiny model planned for h200-x1, written to plan.yaml."""
    from ostinato.compiler.compile import CompileOptions, compile_plan

    work = tmp_path_factory.mktemp("pool_threads")
    build = compile_plan(CompileOptions(tiny_ckpt, work / "plan.yaml", "h200-x1", kernel_dir=kernel_dir, context=4096))
    build.plan.write(work / "plan.yaml")
    return build, work


@pytest.mark.slow  # a compile with kernels
def test_the_plan_carries_the_choice_and_explain_says_why(h200_build):
    build, work = h200_build
    chosen = build.cost.decode_pool_threads
    assert build.plan.policy.decode_cpu_threads == chosen < build.plan.policy.cpu_threads == 96
    assert load_plan(work / "plan.yaml").policy.decode_cpu_threads == chosen   # written, read back
    line = next(line for line in explain(build.plan, build.cost).splitlines() if "expert pool" in line)
    assert line.startswith(f"decode runs the CPU expert pool on {chosen} of 96 threads")
    assert "more threads only add hand-off" in line


@pytest.mark.slow  # a compile with kernels
def test_an_older_plan_without_the_field_runs_decode_on_the_whole_pool_and_a_bigger_one_is_refused(h200_build):
    _, work = h200_build
    text = (work / "plan.yaml").read_text()
    older = "".join(line for line in text.splitlines(keepends=True) if "decode_cpu_threads" not in line)
    assert older != text
    (work / "older.yaml").write_text(older)
    plan = load_plan(work / "older.yaml")
    assert plan.policy.decode_cpu_threads is None
    assert "decode CPU expert pool: all 96 threads" in explain(plan)
    (work / "bigger.yaml").write_text(older.replace("  cpu_threads: 96\n",
                                                    "  cpu_threads: 96\n  decode_cpu_threads: 97\n"))
    with pytest.raises(PlanError, match=r"policy\.decode_cpu_threads' is 97: .* at most policy\.cpu_threads \(96\)"):
        load_plan(work / "bigger.yaml")


def test_the_simulator_decodes_ostinato_on_its_pool_and_the_baselines_on_every_core():
    """bench/simulator prices Ostinato's decode steps at the plan's decode threads (as decode_step does) and each
    baseline's at every core (their own thread settings, not Ostinato's choice)."""
    from ostinato.bench.simulator.ktransformers import kt_cost
    from ostinato.bench.simulator.llamacpp import gguf_cost
    from ostinato.bench.simulator.policy import _decode_table

    every_core = v4_cost("h200-x1", "fp8")
    ours = every_core.with_decode_threads(every_core.choose_decode_threads())
    assert ours.decode_pool_threads < ours.hw.host.cores
    k = ours.cfg.num_experts_per_tok
    pooled, whole = _decode_table(ours, k), _decode_table(every_core, k)
    assert (pooled[:, 0] < whole[:, 0]).all()   # every route cold: the smaller pool's hand-off
    assert kt_cost(ours).decode_pool_threads is None and gguf_cost(ours).decode_pool_threads is None
