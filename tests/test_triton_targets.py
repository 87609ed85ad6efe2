"""Every generated Triton kernel compiles with real Triton for NVIDIA GPUs that are not here (sm_90, sm_89),
into the code the design promises.

The other Triton tests run the kernels in Triton's interpreter, which accepts code the real compiler
refuses (a plain int global read inside @triton.jit, for one). Here both kernels of both variants,
rendered as ostinato-compile renders them for the tiny preset and for DeepSeek-V4-Flash, go through
triton.compile to PTX and a cubin on the CPU (tools/triton_compile_check.py), with the .venv's Triton
and with the pinned Triton of the team's GPU machine (build/triton-3.6, tools/setup_triton_pin.sh).
The argument types are the ones the engine's launch path passes on a GPU (a stub module records them;
a bf16 engine's); likewise the FP8 dense kernel, the mHC mixing kernel and the norm and rope kernels.
What the PTX and ptxas say: no kernel loads a byte, decode streams its weights with 16-byte loads,
prefill multiplies on tensor cores in its activations' dtype (bf16 MMAs for a bf16 engine, both kernels;
fp16 and float32 activations, V4-Flash's prefill only: fp16 and tf32 MMAs), no instruction flushes
denormals (the decoding relies on them), no kernel spills registers, and the FP8 kernels store their
result in its dtype (bf16 half the bits of float32: no cast kernel after them).
Legend: D = hidden, I = expert intermediate, k = routes per token (decode's MAX_ROUTES).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ostinato.compiler.codegen.dense_ops import render_triton_dense_ops
from ostinato.compiler.codegen.hc_mix import HcMixParams, render_triton_hc_mix
from ostinato.compiler.codegen.kernels import render_triton_experts
from ostinato.compiler.codegen.plan_kernels import triton_expert_params
from ostinato.runtime.engine.hot_compute import TritonPoolCompute
from ostinato.runtime.engine.sharded_upload import slice_width
from ostinato.runtime.kernels.dense_ops import HEAD_BLOCK
from ostinato.runtime.kernels.testing import random_packed_expert
from ostinato.runtime.kernels.triton_experts import HotPool
from ostinato.tiny.presets import official_flash_config, preset_config

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tools" / "triton_compile_check.py"
PINNED_VERSION = "3.6.0"
PINNED_PYTHON = ROOT / "build" / "triton-3.6" / "bin" / "python"
KERNEL_FP8 = ROOT / "runtime" / "kernels" / "fp8_triton_kernel.py"
ARCHS = (90, 89)  # H200 / H100, RTX 4090
WARP_SIZE = 32
KERNELS = ("gate_up_kernel", "down_kernel")
TRITON_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.uint8: "u8",
                torch.int8: "i8", torch.int32: "i32", torch.int64: "i64"}


class _Recorder:
    """Stands in for a jitted kernel: kernel[grid](*args, **constexprs) keeps each argument's Triton type
    (a keyword argument is a tl.constexpr: prefill's pool width I) and the constexprs' values."""

    types: list[str] | None = None
    constexprs: dict | None = None

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **constexprs):
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise TypeError("the kernels take only tensors (a scalar would be specialized by value)")
        self.types = ["*" + TRITON_DTYPE[a.dtype] for a in args] + ["constexpr"] * len(constexprs)
        self.constexprs = constexprs


def launcher_signatures(dtype: torch.dtype = torch.bfloat16, limit: float = 10.0) -> dict[str, dict[str, list[str]]]:
    """{variant: {kernel: argument types}} as TritonPoolCompute launches them for activations of `dtype`
    and kernels rendered with SwiGLU limit `limit`; dtypes do not depend on shapes."""
    D, I, k = 64, 64, 2
    stubs = {v: SimpleNamespace(VARIANT=v, D=D, I=I, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, MAX_ROUTES=k, LIMIT=limit,
                                gate_up_kernel=_Recorder(), down_kernel=_Recorder()) for v in ("prefill", "decode")}
    compute = TritonPoolCompute(stubs["prefill"], stubs["decode"])
    # an engine's tensors on the meta device, standing in for CUDA (on the CPU, x is made float32)
    pool = HotPool.stack([random_packed_expert(D, I, torch.Generator().manual_seed(0))], "meta")
    x, out = torch.empty(1, D, dtype=dtype, device="meta"), torch.empty(1, D, device="meta")
    token, slot, weight = torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64), torch.full((k,), 0.5)
    compute.prefill(pool, x, token, slot, weight, out)  # groups its routes on the host
    # decode's routes stay on the device (a captured step's buffers): launch() refuses mixed devices
    compute.decode(pool, x, *(t.to("meta") for t in (slot, token, weight)), out)
    return {v: {name: getattr(s, name).types for name in KERNELS} for v, s in stubs.items()}


def launcher_constexprs(I: int) -> dict[str, dict[str, dict]]:
    """{variant: {kernel: constexprs}} as TritonPoolCompute launches them over a pool of experts I wide
    (prefill passes the width: a sharded upload's slices are I/G)."""
    stubs = {v: SimpleNamespace(VARIANT=v, D=64, I=64, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, MAX_ROUTES=2, LIMIT=10.0,
                                gate_up_kernel=_Recorder(), down_kernel=_Recorder()) for v in ("prefill", "decode")}
    pool = HotPool.stack([random_packed_expert(64, I, torch.Generator().manual_seed(0))], "meta")
    x, out = torch.empty(1, 64, device="meta"), torch.empty(1, 64, device="meta")
    token, slot, weight = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), torch.full((2,), 0.5)
    TritonPoolCompute(stubs["prefill"], stubs["decode"]).prefill(pool, x, token, slot, weight, out)
    return {"prefill": {name: getattr(stubs["prefill"], name).constexprs for name in KERNELS}}


def compile_jobs(signatures: dict, root: Path, activations: torch.dtype = torch.bfloat16) -> list[dict]:
    """One job per (shape, variant, kernel, arch), the kernels rendered with the compiler's own parameters;
    `signatures` as launcher_signatures(activations) gives them. Prefill also at the slice widths a sharded
    upload over 2 and 4 GPUs launches it with (I/2, I/4: runtime/engine/sharded_upload.py)."""
    jobs = []
    for shape, cfg in (("tiny", preset_config("tiny")), ("flash", official_flash_config())):
        D, I, k = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"]
        for params in triton_expert_params(D, I, k, float(cfg["swiglu_limit"])):
            path = render_triton_experts(params, root).path
            for G in (1, 2, 4) if params.variant == "prefill" else (1,):
                W = slice_width(I, G)
                width = f" I/{G}={W}" if G > 1 else ""
                jobs += [{"label": f"{shape} D={D} I={I}{width} {params.variant}", "path": path, "kernel": kernel,
                          "signature": signatures[params.variant][kernel], "arch": arch,
                          "constexprs": launcher_constexprs(W)[params.variant][kernel]
                          if params.variant == "prefill" else None,
                          "activations": TRITON_DTYPE[activations]}
                         for kernel in KERNELS for arch in ARCHS]
    return jobs


def prefill_dtype_jobs(root: Path) -> list[dict]:
    """V4-Flash's prefill kernels as the launcher runs them for the other activation dtypes it takes (the
    GPU tests' fp16 and float32; bench/gpu_setup.py's float32): fp16 x and h, float32 x and h."""
    cfg = official_flash_config()
    D, I, k = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"]
    params = triton_expert_params(D, I, k, float(cfg["swiglu_limit"]))[0]
    path = render_triton_experts(params, root).path
    return [{"label": f"flash D={D} I={I} prefill {TRITON_DTYPE[dtype]} x", "path": path, "kernel": kernel,
             "signature": launcher_signatures(dtype, params.swiglu_limit)["prefill"][kernel], "arch": arch,
             "constexprs": launcher_constexprs(I)["prefill"][kernel], "activations": TRITON_DTYPE[dtype]}
            for dtype in (torch.float16, torch.float32) for kernel in KERNELS for arch in ARCHS]


def fp8_jobs() -> list[dict]:
    """The dense FP8 kernels (runtime/kernels/fp8_triton_kernel.py) as fp8_linear launches them: bf16
    activations, every tile its tiling picks (decode: 16 token rows by 64, 32 or 16 output rows; prefill:
    64 by 64; wo_a's groups are a grid axis, the same code) storing the bf16 result, and the 16-row tile
    that splits K storing its float32 partials; then the split sum, into a bf16 result (and a float32
    engine's float32 one). K, N, a group's rows M and x's strides multiples of 16 (V4-Flash's). "outputs":
    the y elements one program stores (fp8_store_problems)."""
    from ostinato.runtime.kernels import fp8_triton

    def product(tile, y: str, arch: int) -> dict:
        return {"label": f"fp8 dense {'decode' if tile.BT == 16 else 'prefill'} BT={tile.BT} BN={tile.BN} y {y}",
                "path": str(KERNEL_FP8), "kernel": "fp8_linear_kernel", "arch": arch,
                "signature": ["*bf16", "*u8", "*u8", f"*{y}"] + ["i32"] * 7 + ["constexpr"] * 4,
                "divisible": [5, 6, 8, 9, 10], "options": {"num_warps": tile.num_warps}, "outputs": tile.BT * tile.BN,
                "constexprs": {"BT": tile.BT, "BN": tile.BN, "BK": fp8_triton.SCALE_BLOCK,
                               "DOT_DTYPE": fp8_triton.DOT[torch.bfloat16]}}

    split_tile = fp8_triton.Tiling(fp8_triton.BLOCK_T[0], fp8_triton.BLOCK_N[-1])  # the only tile that splits K
    jobs = [product(tile, "bf16", arch) for tile in fp8_triton.TILES for arch in ARCHS]
    jobs += [product(split_tile, "fp32", arch) for arch in ARCHS]
    # the split sum streams float32 partials: wide loads required (the weight-stream check)
    jobs += [{"label": f"fp8 split sum y {y}", "path": str(KERNEL_FP8), "kernel": "fp8_split_sum_kernel",
              "signature": ["*fp32", f"*{y}", "i32", "i32", "constexpr"], "arch": arch, "divisible": [2],
              "constexprs": {"BLOCK": fp8_triton.SPLIT_SUM_BLOCK},
              "options": {"num_warps": fp8_triton.SPLIT_SUM_WARPS}, "outputs": fp8_triton.SPLIT_SUM_BLOCK}
             for y in ("bf16", "fp32") for arch in ARCHS]
    return jobs


def hc_mix_jobs(root: Path) -> list[dict]:
    """The mHC mixing kernel as ostinato-compile renders it for each shape (one program per token, a few
    scalars and [N, N] tiles: not a weight stream, so no wide-load requirement; its exp may flush
    denormals, which weigh nothing next to the sums >= 1 they join)."""
    jobs = []
    for shape, cfg in (("tiny", preset_config("tiny")), ("flash", official_flash_config())):
        params = HcMixParams(n=cfg["hc_mult"], iters=cfg["hc_sinkhorn_iters"], eps=float(cfg["hc_eps"]))
        path = render_triton_hc_mix(params, root).path
        jobs += [{"label": f"{shape} hc_mix N={params.n}", "path": path, "kernel": "hc_mix_kernel",
                  "signature": ["*fp32"] * 4, "arch": arch, "weight_stream": False, "exp_may_flush": True}
                 for arch in ARCHS]
    return jobs


def dense_ops_jobs(root: Path) -> list[dict]:
    """The norm, rope and head kernels as DenseOpsKernel launches them, at V4-Flash's widest rows: the hc
    norm over N x D = 16,384 channels and a 512-wide head with 64 rope channels, bf16 activations (the
    float32 weight and angles as ever; row-wise, not weight streams: no wide-load requirement); the LM
    head's bf16 rows, a weight stream."""
    path = render_triton_dense_ops(root).path
    rms = {"label": "dense_ops rms_norm C=16384", "path": path, "kernel": "rms_norm_kernel",
           "signature": ["*bf16", "*bf16", "*fp32", "i32", "fp32"] + ["constexpr"] * 3,
           "constexprs": {"HAS_WEIGHT": True, "UNWEIGHTED": False, "BLOCK_C": 16384}, "options": {"num_warps": 8}}
    rope = {"label": "dense_ops rope C=512 R=64", "path": path, "kernel": "rope_kernel",
            "signature": ["*bf16", "*bf16", "*fp32", "*fp32", "i32", "i32", "i32"] + ["constexpr"] * 3,
            "constexprs": {"INVERSE": False, "BLOCK_C": 512, "BLOCK_R2": 32}}
    # the head streams V4-Flash's 129,280 x 4,096 bf16 rows: 16-byte loads required (D is a multiple of 16)
    head = {"label": "dense_ops head_logits D=4096", "path": path, "kernel": "head_logits_kernel",
            "signature": ["*fp32", "*bf16", "*fp32", "i32", "i32", "constexpr", "constexpr"], "divisible": [4],
            "constexprs": {"BV": HEAD_BLOCK[0], "BD": HEAD_BLOCK[1]}, "weight_stream": True}
    return [dict(job, arch=arch) for job in (dict(rms, weight_stream=False), dict(rope, weight_stream=False), head)
            for arch in ARCHS]


def run_compile_check(python: str | Path, jobs: list[dict], home: Path) -> list[dict]:
    """Run the check in subprocesses with no TRITON_* variable (conftest sets TRITON_INTERPRET, and
    TRITON_ALLOW_NON_CONSTEXPR_GLOBALS would hide what this test looks for), one a core at once over consecutive
    parts of `jobs` (each compile keeps one core busy; the check compiles its jobs one by one); caches go under
    `home` -> the results, in the order of `jobs`."""
    parts = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                       len(jobs)))
    bounds = [len(jobs) * i // parts for i in range(parts + 1)]

    def check(i: int) -> list[dict]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")} | {"TRITON_HOME": str(home / str(i))}
        run = subprocess.run([str(python), str(CHECK)], input=json.dumps(jobs[bounds[i]:bounds[i + 1]]),
                             capture_output=True, text=True, env=env, timeout=600, check=False)
        assert run.returncode == 0, run.stderr[-4000:]
        return json.loads(run.stdout)

    with ThreadPoolExecutor(parts) as pool:
        results = [r for part in pool.map(check, range(parts)) for r in part]
    assert len(results) == len(jobs), (len(results), len(jobs))
    return results


def _name(job: dict, res: dict) -> str:
    return f"{job['label']} {job['kernel']} sm_{job['arch']} (triton {res['triton']})"


def compile_problems(jobs: list[dict], results: list[dict]) -> list[str]:
    return [f"{_name(j, r)}: " + (r["error"] or f"ptx entry {r['ptx_entry']}, target {r['ptx_target']}, "
                                  f"cubin {r['cubin_bytes']} bytes")
            for j, r in zip(jobs, results, strict=True)
            if r["error"] or not r["ptx_entry"] or not str(r["ptx_target"]).startswith(f"sm_{j['arch']}")
            or not r["cubin_bytes"]]  # ptxas ships in Triton's wheel, so every compile has a cubin


def load_problems(jobs: list[dict], results: list[dict]) -> list[str]:
    """No kernel loads a single byte; decode, a stream of weights, loads 16 bytes at a time (ld.global.v4)
    in its loop (in the kernel when the contraction is a single step: tiny's down)."""
    bad = []
    for j, r in zip(jobs, results, strict=True):
        if not r["error"]:
            byte_loads = [op for op in r["loads"] if re.search(r"\.[bsu]8$", op)]
            wide = "prefill" in j["label"] or not j.get("weight_stream", True) or any(
                ".v4." in op or op.startswith("cp.async.cg.")  # 16-byte async
                for op in r["loop_loads"] or r["loads"])
            if byte_loads or not wide:
                bad.append(f"{_name(j, r)}: loads {r['loads']}, in the loop {r['loop_loads']}")
    return bad


def prefill_mma_problems(jobs: list[dict], results: list[dict]) -> list[str]:
    """Prefill multiplies on tensor cores: wgmma or mma.sync on sm_90, mma.sync on sm_89."""
    return [f"{_name(j, r)}: tensor-core ops {r['mma']}" for j, r in zip(jobs, results, strict=True)
            if "prefill" in j["label"] and not r["error"] and not r["mma"]]


# PTX operand type of prefill's MMAs for each activation dtype: float32 takes the plan's tf32x3 (tf32 MMAs)
MMA_OPERAND = {"bf16": "bf16", "fp16": "f16", "fp32": "tf32"}


def prefill_mma_dtype_problems(jobs: list[dict], results: list[dict]) -> list[str]:
    """Both prefill kernels' MMAs multiply the activations' dtype, e.g. wgmma...f32.bf16.bf16 for a bf16
    engine: a tf32 MMA there (a float32 h in the down kernel) is what the cost model does not price
    (tf32x3: 3 tf32 MMAs at half bf16's rate, about 6x the time)."""
    bad = []
    for j, r in zip(jobs, results, strict=True):
        if "prefill" not in j["label"] or "activations" not in j or r["error"]:  # the expert kernels' jobs
            continue
        want = MMA_OPERAND[j["activations"]]
        wrong = {op: n for op, n in r["mma"].items() if not re.search(rf"\.f32\.{want}\.{want}(\.f32)?$", op)}
        if wrong:
            bad.append(f"{_name(j, r)}: {want} operands expected, got {wrong}")
    return bad


def ftz_problems(jobs: list[dict], results: list[dict]) -> list[str]:
    """The decoded e2m1 value 0.5 is a denormal until it is scaled (templates/triton): nothing may flush it."""
    return [f"{_name(j, r)}: {r['ftz']}" for j, r in zip(jobs, results, strict=True)
            if not r["error"] and r["ftz"] and not j.get("exp_may_flush")]


def spill_problems(jobs: list[dict], results: list[dict]) -> list[str]:
    return [f"{_name(j, r)}: {r['registers']} registers, {r['spill_bytes']} bytes spilled"
            for j, r in zip(jobs, results, strict=True) if not r["error"] and r["spill_bytes"] != 0]


STORE_BITS = {"b16": 16, "b32": 32, "b64": 64, "f16": 16, "f32": 32, "u16": 16, "u32": 32}


def _stored_bits(stores: dict[str, int]) -> int:
    """Bits one thread stores, from {PTX store opcode: count}: e.g. st.global.v4.b32 stores 4 x 32."""
    bits = 0
    for op, n in stores.items():
        vector = re.search(r"\.v(\d)\.", op)
        bits += n * (int(vector.group(1)) if vector else 1) * STORE_BITS[op.rsplit(".", 1)[1]]
    return bits


def fp8_store_problems(jobs: list[dict], results: list[dict]) -> list[str]:
    """The FP8 kernels store y in its own dtype, each output once: a thread's stores add up to its share of
    the program's outputs at y's width (bf16: 16 bits a value, packed), so the kernel rounds to bf16 itself
    and no cast runs after it."""
    bad = []
    for j, r in zip(jobs, results, strict=True):
        if "outputs" not in j or r["error"]:
            continue
        y_bits = {"*bf16": 16, "*fp32": 32}[j["signature"][3 if j["kernel"] == "fp8_linear_kernel" else 1]]
        want = j["outputs"] * y_bits // (WARP_SIZE * j["options"]["num_warps"])
        if _stored_bits(r["stores"]) != want:
            bad.append(f"{_name(j, r)}: stores {r['stores']} ({_stored_bits(r['stores'])} bits a thread), want "
                       f"{j['outputs']} outputs x {y_bits} bits over {j['options']['num_warps']} warps = {want}")
    return bad


@pytest.fixture(scope="module")
def jobs(kernel_dir):
    root = kernel_dir  # rendered into the session's kernel folder (tests/conftest.py)
    return (compile_jobs(launcher_signatures(), root) + prefill_dtype_jobs(root) + fp8_jobs() + hc_mix_jobs(root)
            + dense_ops_jobs(root))


@pytest.fixture(scope="module", params=["venv", "pinned"])
def compiled(request, jobs, tmp_path_factory):
    """(jobs, results) of one Triton: the .venv's or the pinned one."""
    python = sys.executable if request.param == "venv" else PINNED_PYTHON
    if not Path(python).exists():
        pytest.skip(f"no pinned Triton {PINNED_VERSION} at {PINNED_PYTHON}: run bash tools/setup_triton_pin.sh")
    results = run_compile_check(python, jobs, tmp_path_factory.mktemp(request.param))
    if request.param == "pinned":
        assert {r["triton"] for r in results} == {PINNED_VERSION}
    return jobs, results


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_launcher_passes_the_planned_types(dtype):
    """Prefill's h [R, I] is in x's dtype (the down kernel's dot operand: bf16/fp16 MMAs for 16-bit x);
    decode's h stays float32 (its GEMV runs float32 on the CUDA cores whatever x is)."""
    sig, x = launcher_signatures(dtype), TRITON_DTYPE[dtype]
    pool = ["*u8"] * 4  # w1, s1, w3, s3 (down: w2, s2): MXFP4 bytes and e8m0 scales, as stored
    assert sig["prefill"] == {"gate_up_kernel": [f"*{x}", *pool, f"*{x}", "*i64", "*i32", "*i32", "*i32", "constexpr"],
                              "down_kernel": [f"*{x}", *pool[:2], "*fp32", "*i64", "*fp32", "*i32", "*i32", "*i32",
                                              "constexpr"]}
    assert sig["decode"] == {"gate_up_kernel": [f"*{x}", *pool, "*fp32", "*i32", "*i32"],
                             "down_kernel": ["*fp32", *pool[:2], "*fp32", "*i32", "*i32", "*fp32"]}


def test_prefill_launches_at_the_pools_width():
    """A sharded upload's staging holds slices I/G wide: prefill's kernels get the pool's width as their
    constexpr I (one specialization per width), not the module's I; a width that is not whole row blocks
    and contraction steps is refused before any launch."""
    for W in (64, 32):
        assert launcher_constexprs(W) == {"prefill": {"gate_up_kernel": {"I": W}, "down_kernel": {"I": W}}}
    with pytest.raises(ValueError, match="pool width 48: .* BLOCK_N 32"):
        launcher_constexprs(48)


def test_fp16_h_stays_float32_when_swiglu_could_pass_fp16_max():
    """|h| < LIMIT^2: a limit with LIMIT^2 > 65504 (fp16's largest) keeps prefill's h float32 for fp16 x."""
    assert launcher_signatures(torch.float16, 255.0)["prefill"]["down_kernel"][0] == "*fp16"  # 65025
    assert launcher_signatures(torch.float16, 256.0)["prefill"]["down_kernel"][0] == "*fp32"
    assert launcher_signatures(torch.bfloat16, 3e38)["prefill"]["down_kernel"][0] == "*bf16"  # float32's range


CHECKS = {"compile for the target": compile_problems, "load words, not bytes": load_problems,
          "prefill on tensor cores": prefill_mma_problems,
          "prefill MMAs in the activations' dtype": prefill_mma_dtype_problems, "no flushed denormals": ftz_problems,
          "no register spills": spill_problems, "FP8 kernels store y in its dtype": fp8_store_problems}


@pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
@pytest.mark.slow  # Triton compiles every kernel for the GPU targets, in subprocesses
def test_compiled_kernels(compiled, check):
    bad = check(*compiled)
    assert not bad, "\n".join(bad)
