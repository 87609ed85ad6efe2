"""The GPU run off the GPU. A GPU run is rare and short (tools/gpu_check.sh: the pre-flight
tools/gpu_preflight.py, the checks in tests/gpu, then the throughput report bench/gpu_report.py), so
everything up to the CUDA calls is run here:
- the pre-flight names what the machine lacks (a C++ compiler that builds OpenMP, a GPU, free memory, the
  wheelhouse), and the device script puts its lines in the summary;
- without CUDA the report names the figures that stay unverified and fails; with --cpu it runs every
  measurement on the CPU (the tiny model's shapes, Triton's interpreter, the decode graphs' eager twin),
  each in its own process: a crash, an error or a hang becomes a FAILED row while the others still run,
  and the table file grows row by row; its last lines have every ratio the GPU run will report and the
  issue's goals;
- without CUDA `pytest -m gpu tests/gpu` collects every check and skips it (no import fails), and with
  OSTINATO_GPU_TESTS_ON_CPU=1 the same checks run on the CPU, pass, and write their figures;
- the tolerance rule, V4-Flash's dense FP8 shapes and the bucket steps the report and checks run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

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
          *(f"fp8_gemv_bw/peak:{shape}" for shape in TINY_FP8))
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


def test_cpu_mode_runs_every_measurement(work, tmp_path):
    table = tmp_path / "table.txt"
    r = _report("--cpu", "--work", str(work), "--table", str(table))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAILED" not in r.stdout and "raised" not in r.stdout, r.stdout
    lines = r.stdout.splitlines()
    assert lines[-3] == "gpu_report: 7 of 7 measurements ran", lines[-3]
    ratios = dict(item.split("=") for item in lines[-2].removeprefix("ratios: ").split())
    assert set(ratios) == set(RATIOS), lines[-2]
    assert lines[-1].startswith("goals: "), lines[-1]
    written = table.read_text().splitlines()
    assert written[-3:] == lines[-3:]  # the file has what was printed
    assert "64+32+16+8" in r.stdout  # 120 tokens ran as the plan's bucket steps
    assert "float16" in next(line for line in lines if line.startswith("(b) prefill"))  # 16-bit activations


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
    pyproject.write_text('[project]\ndependencies = ["torch>=2.8", "surely-absent-package>=1.0"]\n')
    args = ("--setup", "--only", "cuda,memory,wheelhouse", "--wheelhouse", str(wheels), "--pyproject", str(pyproject))
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    r = _preflight(*args, env=env)
    checks = _lines(r.stdout, "preflight: ")
    assert r.returncode == 1
    assert checks["cuda"] == "ok     NVIDIA H200, driver 570.86.15", checks
    assert checks["memory"] == "FAILED GPU 0: 2.0 GiB free, 8 GiB needed", checks
    assert checks["wheelhouse"].startswith("FAILED surely-absent-package: not installed"), checks
    wheels.mkdir()
    (wheels / "surely_absent_package-1.0-py3-none-any.whl").write_bytes(b"")
    r = _preflight(*args, "--need-gib", "1", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _lines(r.stdout, "preflight: ")["wheelhouse"].startswith("ok     "), r.stdout


@no_cuda
def test_the_device_script_puts_the_preflight_in_its_summary(tmp_path):
    """Without a GPU and with no time for the checks: the pre-flight's lines, then every step's verdict."""
    env = {**os.environ, "OUT": str(tmp_path), "BUDGET_S": "60", "REPORT_S": "60", "SKIP_SETUP": "1",
           "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    summary = (tmp_path / "summary.txt").read_text()
    checks = _lines(summary, "preflight: ")
    assert checks["compiler"].startswith("ok "), summary
    assert checks["cuda"].startswith("FAILED "), summary
    steps = {line.split()[0]: line for line in summary.splitlines() if not line.startswith("preflight: ")}
    assert "FAILED (exit status 1)" in steps["preflight"]
    assert all("NOT RUN (out of time)" in steps[p.stem] for p in GPU_TESTS.glob("test_*.py")), summary
    assert "FAILED (exit status 1)" in steps["report"], summary  # no CUDA: the report fails, by design


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


@no_cuda
def test_the_gpu_checks_pass_on_the_cpu(tmp_path):
    """The checks' CPU twins: without tests/conftest.py (--confcutdir), whose hook skips `gpu` tests here."""
    figures = tmp_path / "figures.jsonl"
    r, outcomes = _gpu_checks(tmp_path / "junit.xml", "--confcutdir", str(GPU_TESTS),
                              env={"OSTINATO_GPU_TESTS_ON_CPU": "1", "OSTINATO_GPU_WORK": str(tmp_path / "work"),
                                   "OSTINATO_GPU_FIGURES": str(figures)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert _files(outcomes) == {p.stem for p in GPU_TESTS.glob("test_*.py")}, outcomes
    assert set(outcomes.values()) == {"passed"}, outcomes
    assert len(outcomes) == 16, sorted(outcomes)  # each check at the tiny shapes, float32 inputs only
    line = next(line for line in r.stdout.splitlines() if line.startswith("gpu figures: "))
    assert {item.split("=")[0] for item in line.removeprefix("gpu figures: ").split()} == set(FIGURES), line
    written = {f["figure"]: f["value"] for f in map(json.loads, figures.read_text().splitlines())}
    assert set(written) == set(FIGURES)
    assert written["graph/eager_decode"] == 0.0  # on the CPU the graphs' eager twin is the eager step
