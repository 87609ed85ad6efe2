"""Each GPU report measurement in its own process: the parent starts `gpu_report --child NAME` under a
time limit and adds its rows to the table file as they come; the child runs the one measurement and
writes each row as a JSON line. A crash, a hang or an error costs only that measurement's rows."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path

import torch

from ostinato.bench.gpu_report_table import Row, TableFile
from ostinato.bench.gpu_setup import GpuSetup, make_setup, sync

FAULT = "OSTINATO_GPU_REPORT_FAULT"  # test hook, see inject_fault
Measurement = Callable[[GpuSetup, float], Iterable[Row]]  # (set-up, peak GB/s) -> its rows as they are measured


# ----- one measurement in this process (--child) -------------------------------------------------------
def inject_fault(name: str, rows_done: int) -> None:
    """Test hook (tests/test_gpu_check_plumbing.py): OSTINATO_GPU_REPORT_FAULT=NAME:KIND[:AFTER][,...] makes
    measurement NAME, once it has given AFTER rows (default 0), end its process at once (exit: as a crash,
    or a sticky CUDA error's abort, would), raise (raise) or hang (hang)."""
    for spec in filter(None, os.environ.get(FAULT, "").split(",")):
        target, kind, *after = spec.split(":")
        if target == name and rows_done == int(after[0] if after else 0):
            print(f"[{name}] {FAULT}: {kind}", flush=True)
            if kind == "exit":
                os._exit(3)
            if kind == "hang":
                time.sleep(3600)
            raise RuntimeError(f"fault injected by {FAULT}")


def child(args: argparse.Namespace, runs: Mapping[str, Measurement]) -> int:
    """Run measurement runs[args.child]; each row goes to args.rows as a JSON line as soon as it is measured."""
    name = args.child

    def emit(row: Row) -> None:
        with open(args.rows, "a") as f:
            f.write(json.dumps(asdict(row)) + "\n")
        print(f"[{name}] {row.what}: {row.value}", flush=True)

    device = torch.device("cpu" if args.cpu else "cuda")
    try:
        setup = make_setup(device, Path(args.work), args.host_isa)
        inject_fault(name, 0)
        for i, row in enumerate(runs[name](setup, args.peak_gbs), 1):
            emit(row)
            inject_fault(name, i)
        sync(device)  # an error of the last kernels surfaces here, inside this measurement
    except Exception as e:  # noqa: BLE001 - reported as this measurement's failed row
        traceback.print_exc()
        emit(Row(name, f"{name}: raised {type(e).__name__}", str(e).splitlines()[0][:100] if str(e) else "",
                 failed=True))
        return 1
    return 0


# ----- the parent: each measurement in a child process -------------------------------------------------
def run_child(name: str, args: argparse.Namespace, work: Path, rows_dir: Path, limit: float,
              out: TableFile) -> None:
    """Measurement `name` in a child process under `limit` seconds, its rows added to `out` as they come;
    a crash, a timeout or an exit status but 0 without a failed row of its own becomes a FAILED row."""
    rows_file = rows_dir / f"{name}.jsonl"
    cmd = [sys.executable, "-m", "ostinato.bench.gpu_report", "--child", name, "--rows", str(rows_file),
           "--work", str(work), "--peak-gbs", str(args.peak_gbs), "--host-isa", args.host_isa]
    start, offset, timed_out = time.monotonic(), 0, False
    print(f"gpu_report: {name}" + (f" (at most {limit:.0f} s)" if limit < math.inf else ""), flush=True)
    # in this process group: the device script's `timeout` ends the children with the report
    proc = subprocess.Popen(cmd + (["--cpu"] if args.cpu else []))

    def new_rows() -> list[Row]:
        nonlocal offset
        if not rows_file.exists():
            return []
        text = rows_file.read_text()
        done = text[offset:text.rfind("\n") + 1] if text.rfind("\n") >= offset else ""
        offset += len(done)
        return [Row(**json.loads(line)) for line in done.splitlines()]

    while True:
        try:
            rc = proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            rc = None
        if rows := new_rows():
            out.add(rows)
        if rc is not None:
            break
        if time.monotonic() - start > limit:
            proc.kill()
            proc.wait()
            timed_out = True
            break
    out.add(new_rows())
    mine = [r for r in out.rows if r.name == name]
    if timed_out:
        why = f"timed out after {limit:.0f} s"
    elif rc < 0:
        why = f"killed by signal {signal.Signals(-rc).name}"
    elif rc:
        why = f"exit status {rc}"
    else:
        why = "" if mine else "gave no rows"
    if why and not any(r.failed for r in mine):
        out.add([Row(name, f"{name}: {why}", f"after {len(mine)} rows", failed=True)])
    if why:
        print(f"[{name}] FAILED: {why}", flush=True)
    out.finish_measurement(name, time.monotonic() - start)
