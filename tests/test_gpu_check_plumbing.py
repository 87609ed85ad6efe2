"""The GPU run off the GPU. A GPU run is rare and short (tools/gpu_check.py, or .sh: the pre-flight
tools/gpu_preflight.py, setup, the warm-up bench/gpu_warmup.py, the report bench/gpu_report.py in two parts around
the checks in tests/gpu), so everything up to the CUDA calls is run here:
- the device script's CPU twin (--cpu), with the server's packages made unimportable: every step passes, it
  leaves at most 8 files in $OUT (the summary and the table as plain files, the rest in one archive), the
  speculation + re-placement check ran, and its summary says which runtime/ modules the checks covered;
  its plan of time, estimated for one H200, fits ~7 minutes with the most important rows first;
- without CUDA (and without --cpu) it stops after its import step and fails, saying why;
- the pre-flight names what the machine lacks (a C++ compiler that builds OpenMP, a GPU, free memory, the
  checks' wheels but never the server's), and setup unpacks exactly the wheels the checks need;
- without CUDA the report names the figures that stay unverified and fails; in its --cpu runs a crash, an
  error or a hang becomes a FAILED row while the others still run, and the table file grows row by row;
- without CUDA `pytest -m gpu tests/gpu` collects every check and skips it (no import fails);
- the tolerance rule, V4-Flash's dense FP8 shapes and the bucket steps the report and checks run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
import torch
from test_gpu_imports import blocking_env

from ostinato.bench.gpu_setup import (
    SHORT_PREFILLS,
    activation_dtype,
    bucket_steps,
    dense_fp8_shapes,
    logit_tolerance,
    make_setup,
    tolerance,
)
from ostinato.checkpoint.config import ModelConfig
from ostinato.plans import plans_dir
from ostinato.runtime.engine.loader import load_engine

REPO = Path(__file__).resolve().parents[1]
GPU_TESTS = REPO / "tests" / "gpu"
TINY_FP8 = ("256x256", "512x128", "128x256", "256x128")  # the tiny model's dense FP8 shapes, largest first
RATIOS = ("decode_bw/peak", "prefill16/model", "h2d/link", "overlap", "hostnode/model", "eager/graph",
          "dynamic/graph16", "dynamic/graph64", "dynamic/graph120", "fp8_gemm_flops/spec",
          *(f"fp8_gemv_bw/peak:{shape}" for shape in TINY_FP8), "fp8_gemv_bw/peak:wo_a_as_run")
# what the checks record beside their verdicts (on the CPU: no CUDA allocator, so no alloc/plan_gpu0)
FIGURES = ("bf16_err/cpu_bf16", "greedy_agree", "held/plan_gpu0", "graph/eager_decode",
           *(f"graph/eager_bucket:{n}" for n in SHORT_PREFILLS))
pytestmark = pytest.mark.slow  # subprocesses; the CPU runs take minutes (Triton's interpreter)
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real checks")


def _run(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=REPO, env={**os.environ, **(env or {})})


def _report(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return _run("-m", "ostinato.bench.gpu_report", *args, env=env)


def _preflight(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return _run(str(REPO / "tools" / "gpu_preflight.py"), *args, env=env, timeout=300)


def _lines(text: str, prefix: str) -> dict[str, str]:
    """{first word after prefix: the rest} of the lines that start with prefix."""
    return dict(line.removeprefix(prefix).split(None, 1) for line in text.splitlines() if line.startswith(prefix))


def _gpu_checks(junit: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """pytest -m gpu over tests/gpu in a fresh process -> (the run, {test id: outcome} from its JUnit XML)."""
    r = _run("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *args,
             str(GPU_TESTS), env=env)
    outcomes = {}
    for case in ET.parse(junit).iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("skipped", "failure", "error")]
        outcomes[f"{case.get('classname')}.{case.get('name')}"] = kinds[0] if kinds else "passed"
    return r, outcomes


def _files(outcomes: dict) -> set[str]:
    return {next(part for part in test_id.split(".") if part.startswith("test_")) for test_id in outcomes}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """One tiny checkpoint and its plans for the report runs here (each would write its own otherwise)."""
    path = tmp_path_factory.mktemp("gpu_work")
    make_setup(torch.device("cpu"), path)
    return path


# ----- the report ------------------------------------------------------------------------------------
@no_cuda
def test_without_cuda_the_report_fails_listing_what_stays_unverified(tmp_path):
    r = _report("--table", str(tmp_path / "table.txt"))
    assert r.returncode == 1, r.stdout + r.stderr  # a GPU run without its GPU must not pass
    assert "UNVERIFIED" in r.stdout and "no CUDA device" in r.stdout
    for name in ("decode", "prefill", "upload", "hostnode", "step", "bucket", "fp8"):
        assert f"  {name} " in r.stdout
    assert _report("--only", "nope").returncode == 2


def test_a_crash_or_an_error_costs_only_its_own_measurement(work, tmp_path):
    """upload's process dies after its first row (as a sticky CUDA error's abort would), hostnode raises
    after its row: each keeps its rows and gets a FAILED row, and both still ran; the goals the checks
    measured come from their figures file."""
    figures = tmp_path / "figures.jsonl"
    figures.write_text("".join(json.dumps(f) + "\n" for f in (
        {"figure": "graph/eager_decode", "value": 3e-6}, {"figure": "alloc/plan_gpu0", "value": 1.2},
        {"figure": "greedy_agree", "value": 1.0})))
    r = _report("--cpu", "--work", str(work), "--only", "upload,hostnode", "--table", str(tmp_path / "t.txt"),
                "--figures", str(figures), env={"OSTINATO_GPU_REPORT_FAULT": "upload:exit:1,hostnode:raise:1"})
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-3] == "gpu_report: 0 of 2 measurements ran, 2 FAILED: hostnode upload", lines[-3]
    rows = [line for line in lines if line.startswith(("(e)", "(d)", "upload:", "hostnode:"))]
    assert [row.split()[0] for row in rows] == ["(e)", "upload:", "(d)", "hostnode:"], rows
    assert "FAILED: after 1 rows" in rows[1] and "exit status 3" in rows[1]
    assert "raised RuntimeError" in rows[3]
    decode = next(line for line in lines if "graph/eager_decode" in line and line.startswith("(c)"))
    alloc = next(line for line in lines if "alloc/plan_gpu0" in line and line.startswith("allocation"))
    assert "<= 1e-05 pass" in decode and "1 +- 0.05 MISSED" in alloc
    assert lines[-1].startswith("goals: 1 of 2 met; missed: alloc/plan_gpu0; not measured: "), lines[-1]


def test_a_hung_measurement_times_out_and_the_table_grows_row_by_row(work, tmp_path):
    table = tmp_path / "t.txt"
    cmd = [sys.executable, "-m", "ostinato.bench.gpu_report", "--cpu", "--work", str(work), "--only",
           "hostnode", "--table", str(table), "--limit-s", "20"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OSTINATO_GPU_REPORT_FAULT": "hostnode:hang:1"})
    try:
        seen_while_running = ""
        while proc.poll() is None:  # its first row must be in the file while it hangs after it
            if table.exists() and "(d) host node" in (text := table.read_text()):
                seen_while_running = text
                break
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert seen_while_running and "timed out" not in seen_while_running, out
    assert proc.returncode == 1, out
    failed = next(line for line in table.read_text().splitlines() if line.startswith("hostnode:"))
    assert "timed out after 20 s" in failed


# ----- the pre-flight and the device script ---------------------------------------------------------
def test_the_preflight_builds_openmp_with_the_kernels_flags():
    from ostinato.compiler.codegen.cxx import BASE_FLAGS

    spec = importlib.util.spec_from_file_location("gpu_preflight", REPO / "tools" / "gpu_preflight.py")
    preflight = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preflight)
    assert preflight.CXX_FLAGS == BASE_FLAGS
    r = _preflight("--only", "compiler")
    assert r.returncode == 0 and _lines(r.stdout, "preflight: ")["compiler"].startswith("ok "), r.stdout + r.stderr


def test_the_preflight_reports_a_missing_compiler():
    env = {k: v for k, v in os.environ.items() if k != "CXX"} | {"PATH": "/nonexistent"}
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_preflight.py"), "--only", "compiler"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert _lines(r.stdout, "preflight: ")["compiler"].startswith("FAILED no C++ compiler"), r.stdout


def test_the_preflight_checks_free_gpu_memory_and_the_wheelhouse(tmp_path):
    bin_dir, wheels, pyproject = tmp_path / "bin", tmp_path / "wheelhouse", tmp_path / "pyproject.toml"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H200, 570.86.15, 2048'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    pyproject.write_text('[project]\ndependencies = ["torch>=2.8", "surely-absent-package>=1.0", "uvicorn>=0.29"]\n')
    args = ("--setup", "--only", "cuda,memory,wheelhouse", "--wheelhouse", str(wheels), "--pyproject", str(pyproject))
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    r = _preflight(*args, env=env)
    checks = _lines(r.stdout, "preflight: ")
    assert r.returncode == 1
    assert checks["cuda"] == "ok     NVIDIA H200, driver 570.86.15", checks
    assert checks["memory"] == "FAILED GPU 0: 2.0 GiB free, 8 GiB needed", checks
    assert checks["wheelhouse"].startswith("FAILED surely-absent-package>=1.0 (not installed, no wheel in"), checks
    assert "uvicorn" not in checks["wheelhouse"]  # the server's: the checks never need it
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "surely_absent_package-1.0-py3-none-any.whl", "w") as z:
        z.writestr("surely_absent_package-1.0.dist-info/METADATA", "Name: surely-absent-package\nVersion: 1.0\n")
    r = _preflight(*args, "--need-gib", "1", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _lines(r.stdout, "preflight: ")["wheelhouse"].startswith("ok     "), r.stdout


def _gpu_check(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """bash tools/gpu_check.sh ARGS with this Python, its folders under tmp_path -> (the run, its $OUT)."""
    out = tmp_path / "out"
    cmd = ["bash", str(REPO / "tools" / "gpu_check.sh"), *args, "--out", str(out), "--logs", str(tmp_path / "logs"),
           "--work", str(tmp_path / "work"), "--site", str(tmp_path / "site")]
    r = subprocess.run(cmd, env={**(env or os.environ), "PYTHON": sys.executable}, capture_output=True, text=True,
                       timeout=2400, check=False)
    return r, out


def _steps(summary: str) -> dict[str, str]:
    """{step or check file: its verdict's first word} from summary.txt's step lines."""
    others = ("plan:", "preflight:", "gpu_check:", "coverage:", "gpu_report:", "goals:")
    return {line.split()[0]: line.split()[1] for line in summary.splitlines() if not line.startswith(others)}


@no_cuda
def test_without_cuda_the_device_script_stops_after_its_imports_and_fails(tmp_path):
    r, out = _gpu_check(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    summary = (out / "summary.txt").read_text()
    assert _lines(summary, "preflight: ")["cuda"].startswith("FAILED "), summary
    assert _steps(summary) == {"preflight": "FAILED", "setup": "ok", "cuda": "FAILED", "pack": "ok"}, summary
    assert "gpu_check: no CUDA device" in summary and "UNVERIFIED" in summary
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz", "summary.txt"]


@no_cuda
def test_the_device_scripts_cpu_twin(tmp_path):
    """The whole run on the CPU, with the server's packages unimportable in every process (test_gpu_imports)."""
    start = time.monotonic()
    r, out = _gpu_check(tmp_path, "--cpu", env=blocking_env(tmp_path / "blocker"))
    seconds = time.monotonic() - start
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr
    # what comes back from a device call: at most 8 files, no more than 2 folders deep
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["gpu_check.tar.gz", "report_table.txt",
                                                                        "summary.txt"]
    summary = (out / "summary.txt").read_text()
    checks = {p.stem for p in GPU_TESTS.glob("test_*.py")}
    steps = _steps(summary)
    assert set(steps) == {"preflight", "setup", "cuda", "warmup", "report:first", "report:rest", "pack", *checks}
    assert set(steps.values()) == {"ok"}, summary
    plan = next(line for line in summary.splitlines() if line.startswith("plan: total"))
    assert float(plan.split()[2]) <= 7 * 60, plan
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        tar.extractall(tmp_path / "packed", filter="data")
    packed = tmp_path / "packed" / "gpu_check"
    assert f"ostinato from {tmp_path / 'site'}" in (packed / "cuda.log").read_text()  # setup's package, not .venv's
    # every check passed, the speculation + re-placement one first
    outcomes = {}
    for junit in (packed / "junit").glob("*.xml"):
        for case in ET.parse(junit).iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("skipped", "failure", "error")]
            outcomes[f"{case.get('classname')}.{case.get('name')}"] = kinds[0] if kinds else "passed"
    assert _files(outcomes) == checks and set(outcomes.values()) == {"passed"}, outcomes
    assert len(outcomes) == 20, sorted(outcomes)  # each check at the tiny shapes, float32 inputs only
    started = (packed / "checks_started.txt").read_text().split()  # a core each at once: they end in any order
    assert sorted(started) == sorted(checks) and started[0] == "test_speculation_replacement", started
    written = {f["figure"] for f in map(json.loads, (packed / "figures.jsonl").read_text().splitlines())}
    assert written == set(FIGURES)
    # the table: every measurement, the most important rows first, the checks' figures judged
    lines = (out / "report_table.txt").read_text().splitlines()
    assert lines[-3] == "gpu_report: 7 of 7 measurements ran", lines[-3]
    ratios = dict(item.split("=") for item in lines[-2].removeprefix("ratios: ").split())
    assert set(ratios) >= set(RATIOS), lines[-2]
    rows = [line[:4] for line in lines[2:] if line.startswith("(")]
    assert rows[:len(TINY_FP8) + 2] == ["(h) "] * (len(TINY_FP8) + 2) and rows[len(TINY_FP8) + 2:][:2] == ["(a) ",
                                                                                                         "(c) "]
    assert any("wo_a as the engine runs it" in line for line in lines)
    assert "64+32+16+8" in "\n".join(lines)  # 120 tokens ran as the plan's bucket steps
    assert lines[-1].startswith("goals: ") and "graph/eager_decode" not in lines[-1].split("missed:")[-1], lines[-1]
    # coverage: the checks' CPU twin ran speculation's and re-placement's modules
    coverage = next(line for line in summary.splitlines() if line.startswith("coverage: "))
    assert "the checks on the CPU twin ran code of" in coverage, coverage
    ran = (packed / "coverage.txt").read_text().split("imported, none of its code ran")[0]
    for module in ("engine/drafter.py", "engine/adapter.py", "model/mtp.py", "model/static_decode/mtp_step.py",
                   "model/static_decode/rollback.py"):
        assert f"runtime/{module}" in ran, module
    print(f"the device script's CPU twin: {seconds:.0f} s")


# ----- what the report and the checks measure ---------------------------------------------------------
def test_the_tolerance_rule():
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    assert tolerance(f32, 4096 + 2048) == pytest.approx(4 * 2**-24 * (1 + math.sqrt(6144)))  # 1.9e-5
    assert tolerance(bf16) == pytest.approx(4 * (2**-8 + 2**-24))  # about 4 bf16 unit roundoffs
    assert tolerance(f16) == pytest.approx(4 * (2**-11 + 2**-24))
    assert tolerance(bf16, 64, accumulate=bf16) == pytest.approx(4 * 2**-8 * 9)  # sums rounded in bf16
    assert tolerance(f32, 4) < tolerance(f32, 400) < 1e-4
    assert logit_tolerance(f32) == 1e-5  # the goal: graphs equal eager to 1e-5 of the logit scale
    assert logit_tolerance(bf16) > 0.5  # no check in bf16: hence the float32 graph-vs-eager engines
    assert activation_dtype(torch.device("cuda")) == bf16 and activation_dtype(torch.device("cpu")) == f16


def test_the_fp8_rows_are_every_dense_fp8_shape_of_v4_flash():
    shapes = dense_fp8_shapes(ModelConfig.from_json(plans_dir() / "models" / "deepseek-v4-flash"))
    assert shapes == {(4096, 8192): ["wo_b"], (8192, 4096): ["wo_a"], (32768, 1024): ["wq_b"],
                      (2048, 4096): ["shared_experts.w1", "shared_experts.w3"], (4096, 2048): ["shared_experts.w2"],
                      (8192, 1024): ["indexer.wq_b"], (1024, 4096): ["wq_a"], (512, 4096): ["wkv"]}


def test_the_short_prefills_run_as_the_plans_bucket_steps(work):
    setup = make_setup(torch.device("cpu"), work)
    for plan in (setup.plan, setup.plan_f32):
        engine = load_engine(plan, setup.ckpt, device="cpu")
        try:
            session = engine.new_session()
            assert [bucket_steps(session, plan, n) for n in SHORT_PREFILLS] == [[16], [64], [64, 32, 16, 8]]
        finally:
            engine.close()
    assert setup.plan_f32.model.dense_format == "float32"
    small = setup.plan.replace(policy=setup.plan.policy.replace(prefill_buckets=[8, 16, 32, 64]))  # the old row's
    engine = load_engine(small, setup.ckpt, device="cpu")
    try:
        with pytest.raises(ValueError, match="does not run as bucket steps"):
            bucket_steps(engine.new_session(), small, 120)
    finally:
        engine.close()


# ----- the checks ------------------------------------------------------------------------------------
@no_cuda
def test_without_cuda_the_gpu_checks_are_collected_and_skipped(tmp_path):
    r, outcomes = _gpu_checks(tmp_path / "junit.xml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _files(outcomes) == {p.stem for p in GPU_TESTS.glob("test_*.py")}, outcomes
    assert set(outcomes.values()) == {"skipped"}, outcomes
