"""The device script's warm-up, untimed, before any measurement or check: the tiny checkpoint and its plans written
once (gpu_setup.make_setup), then the Triton kernels the report's timed rows and the checks launch compiled into
Triton's on-disk cache, which every later process reads. So no measurement's or check's time limit is spent
compiling, and the time a GPU run takes is known up front (tools/gpu_check.py's plan).

    python -m ostinato.bench.gpu_warmup --work DIR [--cpu] [--host-isa avx2|native]

Parts, each in its own process, at once on CUDA (they only compile and run once; nothing is timed):
  experts  the hot decode and prefill kernels at V4-Flash's and the tiny model's expert shapes, in each
           activation dtype the checks use (float32, float16, bf16), and the report's launches
  fp8      the FP8 dense kernel at every dense FP8 shape of V4-Flash, one token (bf16), wo_a through the
           attention's grouped_linear, and the 4096-token GEMM through wo_b
  engines  the tiny engine of each plan (bf16, float32, float32 with speculation and re-placement) with its
           decode graphs captured at load, a 100-token prefill, a 120-token prefill as bucket steps, decode
           steps, and on the speculative plan a draft, a verify and a reject
With --cpu every part runs in this process at the tiny model's shapes, once per code path (Triton's interpreter
compiles nothing: the plumbing only). Exit status 1 when a part failed; the others still warmed their kernels.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from ostinato.bench.gpu_setup import (
    GpuSetup,
    activation_dtype,
    dense_fp8_shapes,
    hot_decode_launches,
    make_setup,
    prefill_launches,
    random_experts,
    sync,
)

PROMPT, BUCKET_PREFILL = 100, 120  # as the report's and checks' sessions: 120 tokens run as 64+32+16+8


def experts(s: GpuSetup) -> None:
    from ostinato.runtime.kernels.routes import group_routes
    from ostinato.runtime.kernels.triton_experts import HotPool, decode_experts, prefill_experts

    dev = s.device
    dtypes = (torch.float32, torch.float16, torch.bfloat16) if s.cuda else (torch.float32,)
    for cfg in (s.cfg, s.tiny) if s.cuda else (s.tiny,):
        pre, dec = s.expert_kernels(cfg)
        D, I, k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
        pool = HotPool.stack(random_experts(cfg, k, 0), dev)
        g = torch.Generator().manual_seed(0)
        routes = group_routes(torch.arange(k).repeat(4, 1), torch.rand(4, k, generator=g), k)
        slots, token = torch.arange(k, dtype=torch.int32, device=dev), torch.zeros(k, dtype=torch.int32, device=dev)
        for dtype in dtypes:
            x = torch.randn(4, D, generator=g).to(dev, dtype)
            prefill_experts(pre, x, routes, pool, torch.zeros(4, D, device=dev))
            decode_experts(dec, x[:1], slots, token, torch.rand(k, device=dev), pool, torch.zeros(1, D, device=dev),
                           torch.empty(k, I, device=dev))
    if s.cuda:  # the report's own launches (on the CPU, the loop above ran the same code)
        hot_decode_launches(s, 1).run()
        prefill_launches(s, 16).run()


def fp8(s: GpuSetup) -> None:
    from ostinato.checkpoint.formats import quantize_fp8
    from ostinato.runtime.kernels.fp8_triton import fp8_linear
    from ostinato.runtime.model import attention
    from ostinato.runtime.model.fp8_matrix import Fp8Matrix

    dev, act, g = s.device, activation_dtype(s.device), torch.Generator().manual_seed(0)
    for (N, K), names in dense_fp8_shapes(s.cfg).items():
        q, scale = quantize_fp8(torch.randn(N, K, generator=g) * 0.02)
        w = Fp8Matrix.of_bytes(q.to(dev), scale.view(torch.uint8).to(dev))
        fp8_linear(torch.randn(1, K, generator=g).to(dev, act), w.q, w.scale)
        if "wo_a" in names:
            G = s.cfg.o_groups
            attention.grouped_linear(torch.randn(1, G * K, generator=g).to(dev, act).reshape(1, G, -1).transpose(0, 1),
                                     w)
        if "wo_b" in names:
            fp8_linear(torch.randn(4096 if s.cuda else 64, K, generator=g).to(dev, act), w.q, w.scale)


def engines(s: GpuSetup) -> None:
    ids = torch.randint(0, s.tiny.vocab_size, (PROMPT + BUCKET_PREFILL,), generator=torch.Generator().manual_seed(0))
    for plan in (s.plan, s.plan_f32, s.plan_spec) if s.cuda else (s.plan_spec,):  # the CPU: the code paths once
        engine = s.engine(graphs=True, plan=plan)
        try:
            es = engine.new_session()
            es.prefill(ids[:PROMPT], last_only=True)
            token = int(es.prefill(ids[PROMPT:], last_only=True)[-1].argmax())
            token = int(es.decode(token).argmax())
            if (draft := es.draft(token)) is not None:
                logits = es.verify(token, int(draft.reshape(-1).argmax()))
                if int(logits[0].argmax()) != int(draft.reshape(-1).argmax()):
                    es.reject()
            sync(s.device)
        finally:
            engine.close()


PARTS = {"experts": experts, "fp8": fp8, "engines": engines}


def run_part(name: str, s: GpuSetup) -> bool:
    start = time.perf_counter()
    try:
        PARTS[name](s)
        sync(s.device)
    except Exception:  # noqa: BLE001 - a failed part costs only its own kernels: the checks say what broke
        traceback.print_exc()
        print(f"gpu_warmup: {name} FAILED after {time.perf_counter() - start:.1f} s", flush=True)
        return False
    print(f"gpu_warmup: {name} done in {time.perf_counter() - start:.1f} s", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="the folder of the tiny checkpoint, its plans, kernels")
    ap.add_argument("--cpu", action="store_true", help="on the CPU at the tiny model's shapes (plumbing)")
    ap.add_argument("--host-isa", default="avx2", help="the tiny plans' host ISA, or 'native'")
    ap.add_argument("--part", choices=tuple(PARTS), help="one part, in this process (what the parent starts)")
    args = ap.parse_args(argv)
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is first imported (later)
        os.environ.setdefault("OSTINATO_CPU_STEP", "eager")
    elif not torch.cuda.is_available():
        print("gpu_warmup: no CUDA device (--cpu runs the plumbing)", file=sys.stderr)
        return 1
    start = time.perf_counter()
    setup = make_setup(torch.device("cpu" if args.cpu else "cuda"), args.work, args.host_isa)
    if args.part:
        return 0 if run_part(args.part, setup) else 1
    print(f"gpu_warmup: the tiny checkpoint and its plans in {time.perf_counter() - start:.1f} s", flush=True)
    if args.cpu:
        ok = [run_part(name, setup) for name in PARTS]
    else:  # one process per part, at once: Triton compiles on the host's cores, the GPU runs little
        part = [sys.executable, "-m", "ostinato.bench.gpu_warmup", "--work", str(args.work), "--host-isa",
                args.host_isa, "--part"]
        procs = [subprocess.Popen([*part, name]) for name in PARTS]
        ok = [p.wait() == 0 for p in procs]
    print(f"gpu_warmup: {sum(ok)} of {len(ok)} parts in {time.perf_counter() - start:.1f} s", flush=True)
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
