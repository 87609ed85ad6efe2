"""The expert pool's hand-off on many cores (#58, ostinato/host_sync.py): measured at 2 threads, grown by one cache-line
transfer per added thread at each of a kernel call's check-ins (libgomp's centralized barrier), the per-thread cost
bounded from the cited EPYC run; a spec resolves it for its cores (HostSpec.handoff_s)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from simulator_helpers import HW, MS

from ostinato import host_sync
from ostinato.bench import handoff
from ostinato.hardware import load_hardware

MEASURED = Path(__file__).resolve().parents[1] / "bench" / "measured" / "handoff.yaml"
US = 1e-6


def test_the_growth_is_nothing_up_to_the_measured_threads_then_one_line_transfer_per_thread_and_check_in():
    assert host_sync.barrier_growth_s(1) == host_sync.barrier_growth_s(2) == 0.0
    assert host_sync.barrier_growth_s(3) == pytest.approx(4 * 163.5e-9)
    assert host_sync.barrier_growth_s(32) == pytest.approx(19.62 * US)
    assert host_sync.barrier_growth_s(64) == pytest.approx(40.548 * US)
    growth = [host_sync.barrier_growth_s(t) for t in range(2, 129)]
    assert all(b > a for a, b in zip(growth, growth[1:]))   # every added thread adds
    with pytest.raises(ValueError, match="threads 0"):
        host_sync.barrier_growth_s(0)


def test_the_per_thread_bound_is_the_cited_epyc_runs_growth_per_added_thread():
    """163.5 ns = (the 8-thread row - the 4-thread row) / 4 of llama.cpp PR #9598's OpenMP test-barrier on an EPYC, as
    bench/handoff.py cites them: above the mean CAS on one shared line of a 64-core part (the mechanism's own cost,
    so a bound) and within the EPYC's cross-complex line transfer."""
    four = handoff.CITED["ggml_test_barrier_epyc_openmp_4_threads"]["value"]
    eight = handoff.CITED["ggml_test_barrier_epyc_openmp_8_threads"]["value"]
    assert host_sync.PER_THREAD_S == pytest.approx((eight - four) / 4 * 1e-9, rel=1e-3)
    cas = handoff.CITED["cas_shared_line_threadripper5995wx"]["value"] * 1e-9
    assert cas < host_sync.PER_THREAD_S <= handoff.CITED["core_to_core_latency_epyc7453"]["value"] * 1e-9


def test_the_rule_starts_from_the_threads_and_the_pool_share_the_hand_off_was_measured_with():
    doc = yaml.safe_load(MEASURED.read_text())
    assert doc["threads"] == host_sync.MEASURED_THREADS
    pool = next(c for c in doc["recommended_handoff_per_layer"]["components"] if c["name"] == "pool_wake_barrier")
    assert pool["from"] == "measured:omp_pool_wake_barrier"   # the skeleton of 4 check-ins the rule counts
    assert doc["cited"] == handoff.CITED and doc["cited_missing"] == handoff.CITED_MISSING


@pytest.mark.parametrize("preset, cores", [("rtx4090d-x4", 32), ("h200-x1", 96), ("cpu-only", 2)])
def test_a_spec_resolves_its_hosts_hand_off_for_its_cores(preset, cores):
    host = load_hardware(preset).host
    assert host.cores == cores
    assert host.handoff_s == pytest.approx(host.task_handoff_s + host_sync.barrier_growth_s(cores))
    assert (host.handoff_s > host.task_handoff_s) == (cores > host_sync.MEASURED_THREADS)


def test_the_resolved_hand_off_is_no_field_of_the_spec():
    """A property: plans carry the spec as written (its fingerprint unchanged) and re-reading one adds nothing twice."""
    hw = load_hardware("rtx4090d-x4")
    assert "handoff_s" not in hw.host.model_dump()
    again = hw.host.replace(task_handoff_s=hw.host.task_handoff_s)
    assert again.handoff_s == hw.host.handoff_s


def test_a_many_core_hosts_layer_pays_its_pools_barrier_growth():
    """cpu_experts_time charges the hand-off the spec resolves for its cores (HostSpec.handoff_s, #58): the measured
    2-thread hand-off, plus host_sync's growth on 32 cores; nothing more on 2."""
    from test_simulator import cost as hand_cost
    few, many = hand_cost(), hand_cost()
    few.hw = HW.replace(host=HW.host.replace(cores=2, task_handoff_s=3 * MS))
    many.hw = HW.replace(host=HW.host.replace(cores=32, task_handoff_s=3 * MS))
    assert few.cpu_experts_time(1, 1.0, 1.0) - few.host_experts_time(1.0, 1.0) == pytest.approx(
        3 * MS + 2 * few.hw.link.latency_s + 2 * 4 / 1e4)
    grown = many.cpu_experts_time(1, 1.0, 1.0) - many.host_experts_time(1.0, 1.0)
    assert grown - (few.cpu_experts_time(1, 1.0, 1.0) - few.host_experts_time(1.0, 1.0)) == pytest.approx(
        host_sync.barrier_growth_s(32))
