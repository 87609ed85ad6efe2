"""Compile rendered Triton kernels with real Triton (not its interpreter) for NVIDIA GPUs that need not be here.

    python tools/triton_compile_check.py < jobs.json > results.json

Needs only the standard library and triton (no torch, no ostinato), so any Python with a Triton
runs it: the project's .venv and the pinned one of tools/setup_triton_pin.sh
(tests/test_triton_targets.py runs both). Nothing touches a GPU: triton.compile gets an explicit
target, and ptxas (bundled with Triton's wheel) turns the PTX into a cubin on the CPU.

A job: {"path": rendered kernel module, "kernel": function name, "signature": ["*fp32", "*u8", ...]
(one type per argument, in order; "constexpr" for a tl.constexpr one), "arch": 90}, and optionally
"constexprs": {name: value}, "divisible": [indexes of integer arguments the launcher passes as
multiples of 16, which Triton specializes like aligned pointers] and "options": {"num_warps": 8, ...}
(the launch options). A result: the job's kernel and arch, plus "triton"
(version), "error" (None, or the exception's type and text), "ptx_entry" (the PTX defines the
kernel), "ptx_target" (the PTX's .target line), "cubin_bytes" (0 when there is none), "seconds",
and what the code will do on the GPU:
- "loads", "loop_loads": {PTX global load opcode: count} in the kernel and inside its loops (the
  lines from a label back to a branch that jumps up to it), e.g. {"ld.global.v4.b32": 8}; cp.async
  (global to shared, for a pipelined loop) counts as a load;
- "stores": {PTX global store opcode: count} in the kernel, e.g. {"st.global.v4.b32": 1};
- "mma": {PTX tensor-core opcode (mma.sync..., wgmma.mma_async...): count};
- "ftz": {PTX opcode that flushes denormals to zero (.ftz): count};
- "registers", "spill_bytes" (stores + loads), "stack_bytes": from ptxas -v, which Triton runs to
  make the cubin (the compile is forced so that its log is there, and read off Triton's stdout).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import sys
import time
from collections import Counter

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

WARP_SIZE = 32  # GPUTarget's third argument is the warp size: 32 on every NVIDIA GPU (64 is AMD's wavefront)


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_job(job: dict, modules: dict) -> dict:
    if job["path"] not in modules:  # each rendered module is imported once
        modules[job["path"]] = _load(job["path"], f"rendered_kernels_{len(modules)}")
    fn = getattr(modules[job["path"]], job["kernel"])
    names, types = fn.arg_names, job["signature"]
    if len(names) != len(types):
        raise TypeError(f"{job['kernel']} takes {len(names)} arguments {names}, the launcher passes {len(types)}")
    # Every pointer 16-byte aligned, as Triton's launcher specializes fresh torch tensors (tt.divisibility).
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(types)
             if t.startswith("*") or i in job.get("divisible", ())}
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # dump_ptxas_log prints; stdout is this tool's JSON
        compiled = triton.compile(ASTSource(fn, dict(zip(names, types, strict=True)), job.get("constexprs"), attrs),
                                  target=GPUTarget("cuda", job["arch"], WARP_SIZE), options=job.get("options"))
    ptx = compiled.asm["ptx"]
    target = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE)
    return {"ptx_entry": re.search(rf"\.entry\s+{job['kernel']}\s*\(", ptx) is not None,
            "ptx_target": target.group(1) if target else None, "cubin_bytes": len(compiled.asm.get("cubin", b""))} \
        | ptx_facts(ptx) | ptxas_facts(log.getvalue())


_OPCODE = re.compile(r"^\s*(?:@!?%p\w+\s+)?([a-z][\w.:]*)", re.MULTILINE)


def _count(lines: list[str], pattern: str) -> dict[str, int]:
    ops = (m.group(1) for line in lines if (m := _OPCODE.match(line)))
    return dict(Counter(op for op in ops if re.match(pattern, op)))


def ptx_facts(ptx: str) -> dict:
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"(\$L__BB\w+):", line))}
    loops = [lines[labels[m.group(1)]:i + 1] for i, line in enumerate(lines)
             if (m := re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\w+);", line)) and labels.get(m.group(1), i) < i]
    load = r"ld\.global\.|cp\.async\.c[ag]\.shared\.global"  # cp.async: a pipelined load (tl.dot operands)
    return {"loads": _count(lines, load), "loop_loads": _count([x for loop in loops for x in loop], load),
            "stores": _count(lines, r"st\.global\."), "mma": _count(lines, r"(wgmma\.mma_async|mma\.sync)\."),
            "ftz": _count(lines, r".*\.ftz\b")}


def ptxas_facts(log: str) -> dict:
    regs = re.search(r"Used (\d+) registers", log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_bytes": int(frame.group(2)) + int(frame.group(3)) if frame else None,
            "stack_bytes": int(frame.group(1)) if frame else None}


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("TRITON_INTERPRET is set: this check needs the real compiler")
    knobs.compilation.always_compile = True  # a cached kernel would skip ptxas, and its log
    knobs.nvidia.dump_ptxas_log = True
    modules, results = {}, []
    for job in json.load(sys.stdin):
        t0, res = time.perf_counter(), {"kernel": job["kernel"], "arch": job["arch"], "triton": triton.__version__}
        try:
            res |= compile_job(job, modules) | {"error": None}
        except Exception as e:  # noqa: BLE001 - reported per job, the other jobs still run
            res["error"] = f"{type(e).__name__}: {e}"
        results.append(res | {"seconds": round(time.perf_counter() - t0, 2)})
    json.dump(results, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
