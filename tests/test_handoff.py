"""bench/handoff.py's structure from a short run (few samples): the YAML it writes, its stats, its cited block.
No timing thresholds: only that every figure is a positive median no larger than its p90."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest
import yaml

from ostinato.bench import handoff

HAS_KT = importlib.util.find_spec("kt_kernel") is not None
HAS_CC = bool(shutil.which("cc") or shutil.which("gcc"))


def test_quantile_and_summary():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert handoff.quantile(sorted(xs), 0.5) == 3.0
    assert handoff.quantile(sorted(xs), 0.9) == pytest.approx(4.6)
    s = handoff.summarize([1.23456e-6, 2.0e-6, 3.0e-6])
    assert s == {"median_s": 2e-06, "p90_s": 2.8e-06, "samples": 3}
    assert handoff.sig3(0.000123456) == 0.000123


def test_cited_block_has_a_source_for_every_entry():
    assert handoff.CITED
    for name, c in handoff.CITED.items():
        assert set(c) == {"value", "unit", "what", "source"}, name
        assert c["source"].startswith("https://"), name
        assert isinstance(c["value"], float) and c["value"] > 0, name
        assert c["unit"] and c["what"], name


@pytest.mark.slow  # compiles the CPU expert kernel (cached per session) and the ping-pong helper
def test_short_run_writes_the_schema(tmp_path, kernel_dir):
    out = tmp_path / "handoff.yaml"
    # in a child process: kt_kernel's extension turns on flush-to-zero for the process that loads it
    subprocess.run([sys.executable, "-m", "ostinato.bench.handoff", "--samples", "20", "--idle-gap-ms", "2",
                    "--out", str(out), "--build-dir", str(tmp_path / "build"), "--kernel-root", str(kernel_dir)],
                   check=True, capture_output=True, timeout=600)
    doc = yaml.safe_load(out.read_text())

    assert doc["source"].startswith("python -m ostinato.bench.handoff")
    assert doc["threads"] >= 1
    assert set(doc["load_average_1min"]) == {"before", "after"}
    expected = {"ours_1route_Nthreads", "ours_1route_1thread", "ours_0routes_Nthreads",
                "ours_1route_Nthreads_after_idle", "ours_1route_1thread_after_idle"}
    if HAS_KT:
        expected |= {"kt_submit_sync_1worker", "kt_submit_sync_1worker_after_idle"}
    else:
        assert "kt_submit_sync_1worker" in doc["skipped"]
    if HAS_CC:
        expected |= {"omp_skeleton_Nthreads", "omp_skeleton_1thread", "omp_skeleton_Nthreads_after_idle",
                     "condvar_round_trip", "condvar_one_way", "spin_round_trip", "spin_one_way", "ctypes_noop_call",
                     "c_to_python_callback_same_thread", "c_to_python_callback_other_thread"}
        assert "omp_pool_wake_barrier" in doc["derived"]
    else:
        assert "condvar_round_trip" in doc["skipped"]
    assert expected <= set(doc["measurements"])
    for name, m in doc["measurements"].items():
        assert isinstance(m["median_s"], float) and isinstance(m["p90_s"], float), name
        assert 0 < m["median_s"] <= m["p90_s"], name
        assert m["samples"] >= 3 and m["what"], name
    for name, m in doc["derived"].items():  # differences: may be <= 0 on a 1-core machine, but ordered
        assert m["median_s"] <= m["p90_s"], name

    rec = doc["recommended_handoff_per_layer"]
    assert rec["value_s"] == pytest.approx(sum(c["value_s"] for c in rec["components"]), rel=0.01)
    assert all(c["from"].split(":")[0] in ("cited", "measured") for c in rec["components"])

    assert doc["cited"] and all(c["source"] for c in doc["cited"].values())
    assert doc["cited_missing"]


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_pingpong_library_is_cached(tmp_path):
    first = handoff.build_pingpong(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert handoff.build_pingpong(tmp_path) == first and first.stat().st_mtime_ns == mtime
    pp = handoff.Pingpong(first)
    assert len(pp.round_trips("condvar", 2, 5)) == 5 and len(pp.round_trips("spin", 2, 5)) == 5
    assert all(v > 0 for v in pp.callbacks(True, 2, 5))
    assert all(v > 0 for v in pp.omp_regions(2, 2, 5)) and len(pp.omp_regions(1, 0, 3, gap_s=1e-4)) == 3
