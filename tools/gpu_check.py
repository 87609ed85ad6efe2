"""The device script: what a lent GPU machine (one H200, no network, minutes of device time) runs, as one
command, with the machine's own Python (torch, Triton, numpy, ... and no pydantic: docs/gpu.md's device call
carries build/wheelhouse). It leaves three files in $OUT (the device tool brings back at most 8, no more than 2
folders deep):
  summary.txt       the plan of time, then a line per step and pre-flight check as each ends, the goals, and
                    which runtime/ modules the checks imported and ran
  report_table.txt  the throughput table (bench/gpu_report.py), rewritten as each row is measured
  gpu_check.tar.gz  everything else, packed again after every step: each step's log, the checks' JUnit XML,
                    their figures, the report's output, the coverage of runtime/ by the checks

    python3 tools/gpu_check.py [--cpu] [--out DIR] [--budget-s S] [--jobs N] [--work DIR] [--plan]
    bash tools/gpu_check.sh ...   (the same)

The steps, the rows that matter most first; each runs whatever happened to the ones before it, except that
without CUDA (and without --cpu) nothing runs after the cuda step, which says so, and the exit status is 1:
  preflight     tools/gpu_preflight.py (a C++ compiler that builds OpenMP code, a GPU, free memory, the wheels)
  setup         build/gpu_site: the package as pyproject.toml maps it (symlinks into this checkout) and the
                wheels of what the checks need that this Python lacks, unpacked: no pip, no network, nothing
                of the server's (gpu_preflight.SERVER_ONLY), so a server package missing here stops nothing
  cuda          the project imports from build/gpu_site, and torch sees a GPU
  warmup        bench/gpu_warmup.py, untimed: the tiny checkpoint and its plans, the Triton kernels compiled
  report:first  the FP8 GEMV at every dense shape of V4-Flash, wo_a as the engine runs it and the FP8 GEMM;
                hot-expert decode; a decode graph's tok/s
  checks        tests/gpu, one file per process, up to --jobs at once, the speculation + re-placement check first
                (the order they started in: checks_started.txt in the archive; summary lines come as each ends)
  report:rest   prefill, upload, host node and bucket rows, and the goals judged from the checks' figures
Time: the plan printed first gives each step's estimate on one H200 and its limit. No step starts, and a running
one is stopped, past --budget-s (BUDGET_S, default 420 s: a first run and a rerun fit the device tool's 15
minutes with its start-ups), keeping RESERVE_S for the report's last part to write the goals.
--cpu: the same on the CPU (Triton's interpreter, graphs as their eager twin; tests/test_gpu_check_plumbing.py),
with a budget of 1800 s and no step limits; ~3 minutes on this project's 2-core CPU machine.
Exit status 1 when a step or pre-flight check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _sibling(name: str):
    """tools/<name>.py (standard library only, as this is), loaded from its file: the checkout's package is
    not importable before setup, and scripts never edit sys.path."""
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # registered first, as an import would
    spec.loader.exec_module(module)
    return module


gpu_preflight = _sibling("gpu_preflight")

BUDGET_S = 420.0          # ~7 minutes; the device call's timeout_s is this plus a margin (docs/gpu.md)
CPU_BUDGET_S = 1800.0     # --cpu: Triton's interpreter is slow, and the steps' limits do not apply
RESERVE_S = 30.0          # kept for report:rest, which judges the goals whatever time is left for its rows
LEAST_S = 10.0            # a check file or a step with less time than this left does not start
CHECK_S = 120.0           # one check file's limit
JOBS = 4                  # check files at once on CUDA (16 host cores, 139 GiB of GPU memory; ~8 GiB each)
ARCHIVE = "gpu_check.tar.gz"
FIRST = ("fp8", "decode", "step")            # the report's rows that matter most: before the checks
REST = ("prefill", "upload", "hostnode", "bucket")
FIRST_CHECK = "test_speculation_replacement"  # the GPU paths no other check runs


@dataclass(frozen=True)
class Step:
    name: str
    estimate_s: float  # on one H200 (reasoned, not yet measured: docs/gpu.md)
    limit_s: float     # at most this long, and never past the budget
    what: str


# The estimates: a process that imports torch and the project and makes a CUDA context ~8 s; a Triton kernel's
# first compile 1-3 s (the warm-up's three parts compile about 40 at once on 16 cores); the tiny engine loads and
# captures its decode graphs in a few seconds; V4-Flash's matrices stream at TB/s, so the timed loops take
# seconds. The plumbing test holds their sum to ~7 minutes.
PLAN = (
    Step("preflight", 10, 60, "a C++ compiler that builds OpenMP code, a GPU and its free memory, the wheels"),
    Step("setup", 3, 60, "build/gpu_site: the package's links and the wheels the checks need"),
    Step("cuda", 10, 60, "the project imports from build/gpu_site; torch sees the GPU"),
    Step("warmup", 90, 150, "the tiny checkpoint and plans; Triton kernels compiled (untimed)"),
    Step("report:first", 80, 150, "FP8 GEMV x8 shapes + wo_a as run + GEMM; hot-expert decode; decode graph tok/s"),
    Step("checks", 100, 240, f"tests/gpu, one file per process, up to {JOBS} at once ({FIRST_CHECK} first)"),
    Step("report:rest", 80, 150, "prefill, upload, host node, bucket rows; the goals"),
    Step("pack", 2, 30, f"{ARCHIVE}"),
)


def plan_text(budget_s: float) -> str:
    lines = [f"{'step':<14} {'estimate':>9} {'limit':>6}  what"]
    lines += [f"{s.name:<14} {s.estimate_s:>7.0f} s {s.limit_s:>4.0f} s  {s.what}" for s in PLAN]
    total = sum(s.estimate_s for s in PLAN)
    lines.append(f"{'total':<14} {total:>7.0f} s ({total / 60:.1f} min, estimated on one H200); "
                 f"budget {budget_s:.0f} s")
    return "\n".join("plan: " + line for line in lines)


class Run:
    """One run's folders, clock and summary."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.cpu = args, args.cpu
        self.out = Path(args.out).resolve()
        self.logs = Path(args.logs).resolve() if args.logs else REPO / "build" / "gpu_check_logs"
        self.work = Path(args.work).resolve() if args.work else REPO / "build" / "gpu_check_work"
        self.site = Path(args.site).resolve() if args.site else REPO / "build" / "gpu_site"
        self.deadline = time.monotonic() + args.budget_s
        self.failed = False
        shutil.rmtree(self.logs, ignore_errors=True)
        for folder in (self.out, self.logs, self.logs / "junit", self.logs / "checks", self.work):
            folder.mkdir(parents=True, exist_ok=True)
        for name in ("summary.txt", "report_table.txt", ARCHIVE):
            (self.out / name).unlink(missing_ok=True)
        # PYTHONSAFEPATH: `python -m`/`-c` must not put the checkout first on sys.path, where `ostinato` is a
        # folder without its subpackages (pyproject.toml maps them in): the site's package is the one to import
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(self.site),
                                                                               os.environ.get("PYTHONPATH")))),
                    "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1", "OSTINATO_GPU_WORK": str(self.work),
                    "OSTINATO_GPU_FIGURES": str(self.logs / "figures.jsonl"),
                    "OSTINATO_GPU_COVERAGE": str(self.logs / "coverage")}
        if self.cpu:
            self.env |= {"OSTINATO_GPU_TESTS_ON_CPU": "1", "TRITON_INTERPRET": "1", "OSTINATO_CPU_STEP": "eager"}

    def left(self, reserve: float = 0.0) -> float:
        return self.deadline - time.monotonic() - reserve

    def limit(self, seconds: float) -> float:
        """A step's (or check file's) own limit: none with --cpu, where only the budget bounds it."""
        return float("inf") if self.cpu else seconds

    def say(self, line: str) -> None:
        """A line of the summary: printed, and appended to summary.txt at once (a run cut short keeps it)."""
        print(line, flush=True)
        with open(self.out / "summary.txt", "a") as f:
            f.write(line + "\n")

    def verdict(self, name: str, verdict: str, seconds: float) -> None:
        self.failed |= verdict != "ok"
        self.say(f"{name:<40} {verdict:<28} {seconds:5.0f} s")

    def run(self, step: Step, cmd: list[str], reserve: float | None = RESERVE_S, log: str | None = None,
            show: bool = True) -> int | None:
        """cmd under min(its limit, the budget less `reserve`; reserve None: its limit alone), its output in
        logs/LOG (the end shown when it fails, with `show`) -> its exit status, None when it did not run or was
        stopped."""
        limit = min(self.limit(step.limit_s), math.inf if reserve is None else self.left(reserve))
        if limit < LEAST_S:
            self.verdict(step.name, "NOT RUN (out of time)", 0)
            return None
        start = time.monotonic()
        path = self.logs / (log or f"{step.name.replace(':', '_')}.log")
        with open(path, "a") as f:
            proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own process group: stopped with its children
            rc = wait(proc, limit)
        seconds = time.monotonic() - start
        verdict = "ok" if rc == 0 else f"TIMED OUT after {limit:.0f} s" if rc is None else f"FAILED (exit status {rc})"
        self.verdict(step.name, verdict, seconds)
        if rc and show:
            print(tail(path), flush=True)
        return rc

    def pack(self) -> None:
        """Everything in logs/ as one archive in $OUT, replaced whole."""
        tmp = self.out / f".{ARCHIVE}.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.logs, arcname="gpu_check")
        os.replace(tmp, self.out / ARCHIVE)


def wait(proc: subprocess.Popen, limit: float) -> int | None:
    """proc's exit status, or None after stopping its process group once `limit` seconds have passed."""
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        stop(proc)
        return None


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def tail(path: Path, lines: int = 8) -> str:
    text = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(f"    | {line}" for line in text[-lines:])


# ----- setup: build/gpu_site ----------------------------------------------------------------------------------------
def link_package(site: Path, repo: Path = REPO) -> None:
    """site/ostinato: the package as pyproject.toml's package-dir maps it (ostinato.runtime -> runtime/, ...),
    made of symlinks into the checkout, so `import ostinato` needs neither pip nor setuptools."""
    import tomllib  # Python 3.11+ (the GPU machine's is 3.12)

    mapping = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = site / "ostinato"
    package.mkdir(parents=True)
    for entry in (repo / mapping["ostinato"]).iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        if name == "ostinato":
            continue
        parent, _, sub = name.rpartition(".")
        if parent != "ostinato":
            raise ValueError(f"pyproject.toml package-dir: {name!r} is not a subpackage of ostinato")
        (package / sub).symlink_to(repo / folder)


def make_site(site: Path, wheelhouse: Path, log, pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """build/gpu_site afresh: the package's links, and each wheel of what the checks need that this Python lacks
    unpacked (a wheel's root is importable as it is) -> what is still lacking (a line each)."""
    needs = gpu_preflight.check_needs(pyproject)
    wheels, lacking = gpu_preflight.wheels_to_install(needs, wheelhouse)
    shutil.rmtree(site, ignore_errors=True)
    link_package(site)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        print(f"setup: unpacked {wheel.name}", file=log)
    print(f"setup: {site}: the ostinato package's links, {len(wheels)} wheels; the checks need: {' '.join(needs)}",
          file=log)
    for line in lacking:
        print(f"setup: LACKING {line}", file=log)
    return lacking


# ----- the checks ---------------------------------------------------------------------------------------------------
def check_files() -> list[Path]:
    files = sorted((REPO / "tests" / "gpu").glob("test_*.py"))
    return sorted(files, key=lambda p: p.stem != FIRST_CHECK)


def run_checks(r: Run, step: Step) -> None:
    """Each check file in its own process (a sticky CUDA error, a crash or a hang costs only its file), up to
    --jobs at once, each under CHECK_S and the budget less RESERVE_S; one summary line per file."""
    pending, running = check_files(), {}
    step_start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    if r.cpu:
        cmd += ["--confcutdir", str(REPO / "tests" / "gpu")]  # tests/conftest.py skips `gpu` tests without CUDA
    while pending or running:
        while pending and len(running) < r.args.jobs:
            file = pending.pop(0)
            limit = min(r.limit(CHECK_S), r.limit(step.limit_s) - (time.monotonic() - step_start), r.left(RESERVE_S))
            if limit < LEAST_S:
                r.verdict(file.stem, "NOT RUN (out of time)", 0)
                continue
            log = open(r.logs / "checks" / f"{file.stem}.log", "w")  # noqa: SIM115 - closed when it ends
            with open(r.logs / "checks_started.txt", "a") as order:  # start order (the summary: end order)
                order.write(file.stem + "\n")
            proc = subprocess.Popen([*cmd, f"--junitxml={r.logs / 'junit' / (file.stem + '.xml')}", str(file)],
                                    cwd=REPO, env=r.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            running[file.stem] = (proc, log, time.monotonic(), limit)
        for name, (proc, log, start, limit) in list(running.items()):
            rc = proc.poll()
            over = rc is None and time.monotonic() - start > limit
            if rc is None and not over:
                continue
            if over:
                stop(proc)
            log.close()
            verdict = "ok" if rc == 0 else f"TIMED OUT after {limit:.0f} s" if over else f"FAILED (exit status {rc})"
            r.verdict(name, verdict, time.monotonic() - start)
            if rc:
                print(tail(Path(log.name)), flush=True)
            del running[name]
        time.sleep(0.2)


def cpu_jobs() -> int:
    """--cpu: a check file per core, up to JOBS (each is one busy Python thread, the interpreter's kernels)."""
    return max(1, min(JOBS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def coverage(r: Run) -> str:
    """One line: the runtime/ modules the checks' processes ran code of and imported (conftest.runtime_coverage);
    the lists in logs/coverage.txt."""
    files = sorted((r.logs / "coverage").glob("*.json"))
    if not files:
        return "coverage: no check process reported its runtime/ modules"
    imported, ran = set(), set()
    for f in files:
        data = json.loads(f.read_text())
        imported |= set(data["imported"])
        ran |= set(data["ran"])
    runtime = REPO / "runtime"
    every = {str(p.relative_to(runtime)) for p in runtime.rglob("*.py") if "__pycache__" not in p.parts}
    modules = every - {p for p in every if p.endswith("__init__.py")}
    ran, imported = ran & modules, imported & modules
    where = "the CPU twin" if r.cpu else "the GPU"
    lists = {"ran": ran, "imported, none of its code ran": imported - ran, "never imported": modules - imported}
    (r.logs / "coverage.txt").write_text("".join(f"{k} ({len(v)}):\n" + "".join(f"  runtime/{m}\n" for m in sorted(v))
                                                 for k, v in lists.items()))
    return (f"coverage: the checks on {where} ran code of {len(ran)} of {len(modules)} runtime/ modules "
            f"({len(files)} processes); imported only: {' '.join(sorted(imported - ran)) or 'none'}; never imported: "
            f"{' '.join(sorted(modules - imported)) or 'none'}")


# ----- the run ------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="the CPU twin of every step (plumbing; figures mean nothing)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "build" / "gpu_check"),
                    help="where the three result files go (default $OUT, else build/gpu_check)")
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", 0)) or None,
                    help=f"the whole run's time (default $BUDGET_S, else {BUDGET_S:g}; --cpu {CPU_BUDGET_S:g})")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", 0)) or None,
                    help=f"check files at once (default {JOBS} on CUDA; with --cpu one a core, up to {JOBS})")
    ap.add_argument("--work", help="the tiny checkpoint, its plans and kernels (default build/gpu_check_work, kept "
                                   "for a rerun)")
    ap.add_argument("--logs", help="the logs packed into the archive (default build/gpu_check_logs, made afresh)")
    ap.add_argument("--site", help="where setup makes the package importable (default build/gpu_site)")
    ap.add_argument("--wheelhouse", type=Path, default=REPO / "build" / "wheelhouse")
    ap.add_argument("--plan", action="store_true", help="print the plan of time and exit")
    args = ap.parse_args(argv)
    args.jobs = args.jobs or (cpu_jobs() if args.cpu else JOBS)
    args.budget_s = args.budget_s or (CPU_BUDGET_S if args.cpu else BUDGET_S)
    if args.plan:
        print(plan_text(args.budget_s))
        return 0
    r = Run(args)
    steps = {s.name: s for s in PLAN}
    py = sys.executable
    r.say(f"gpu_check: {'the CPU twin (--cpu)' if r.cpu else 'GPU run'}, {sys.version.split()[0]} at {py}")
    r.say(plan_text(args.budget_s))
    try:
        preflight = [py, str(REPO / "tools" / "gpu_preflight.py"), "--setup", "--wheelhouse", str(args.wheelhouse)]
        # the pre-flight and the imports run whatever the budget: seconds, and what every later step needs
        r.run(steps["preflight"], preflight + (["--only", "compiler,wheelhouse"] if r.cpu else []), reserve=None,
              show=False)  # its lines go to the summary next
        log = r.logs / "preflight.log"
        for line in log.read_text().splitlines() if log.exists() else []:
            if line.startswith("preflight: "):
                r.say(line)
        start = time.monotonic()
        with open(r.logs / "setup.log", "w") as log:
            lacking = make_site(r.site, args.wheelhouse, log)
        r.verdict("setup", "ok" if not lacking else f"FAILED ({len(lacking)} lacking)", time.monotonic() - start)
        probe = ("import torch, ostinato, ostinato.bench.gpu_report\n"
                 "print('ostinato from', ostinato.__file__, '| torch', torch.__version__, 'CUDA', torch.version.cuda)\n"
                 f"assert ostinato.__file__.startswith({str(r.site)!r}), 'ostinato is not the site\\'s'\n"
                 + ("print('device: cpu (--cpu)')" if r.cpu else "assert torch.cuda.is_available(), 'no CUDA device'\n"
                    "print('device:', torch.cuda.get_device_name())"))
        if r.run(steps["cuda"], [py, "-c", probe], reserve=None) != 0:
            if not r.cpu:
                r.say("gpu_check: no CUDA device, or the project does not import (cuda.log in the archive): nothing "
                      "checked or measured; every GPU figure stays UNVERIFIED (--cpu runs the CPU twin)")
            return 1
        print((r.logs / "cuda.log").read_text().strip(), flush=True)
        r.pack()
        cpu = ["--cpu"] if r.cpu else []
        r.run(steps["warmup"], [py, "-m", "ostinato.bench.gpu_warmup", "--work", str(r.work), *cpu])
        r.pack()
        report = [py, "-m", "ostinato.bench.gpu_report", "--work", str(r.work), "--table",
                  str(r.out / "report_table.txt"), "--state", str(r.logs / "report_rows.jsonl"), *cpu]
        limit = min(r.limit(steps["report:first"].limit_s), r.left(RESERVE_S))
        r.run(steps["report:first"], [*report, "--only", ",".join(FIRST), "--budget-s", str(limit - 10)],
              log="report.txt")
        r.pack()
        run_checks(r, steps["checks"])
        r.say(coverage(r))
        r.pack()
        limit = min(r.limit(steps["report:rest"].limit_s), r.left(5))
        r.run(steps["report:rest"], [*report, "--only", ",".join(REST), "--budget-s", str(limit - 15),
                                     "--figures", str(r.logs / "figures.jsonl")], reserve=5, log="report.txt")
        text = (r.out / "report_table.txt").read_text() if (r.out / "report_table.txt").exists() else ""
        for line in text.splitlines()[-3:]:
            if line.startswith(("gpu_report: ", "goals: ")):
                r.say(line)
    finally:
        start = time.monotonic()
        r.pack()
        r.verdict("pack", "ok", time.monotonic() - start)
        table = r.out / "report_table.txt"
        if table.exists():
            print(f"gpu_check: the table ({table}):\n{table.read_text()}", flush=True)
        print(f"gpu_check: results in {r.out}: {' '.join(sorted(p.name for p in r.out.iterdir()))}", flush=True)
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
