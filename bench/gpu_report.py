"""GPU throughput report: the CUDA paths' speeds on one GPU, against the GPU's peak, the hardware spec and
the cost model. Their pass/fail properties are the checks in tests/gpu (`pytest -m gpu tests/gpu`);
tools/gpu_check.sh runs both on a lent GPU machine.

    python -m ostinato.bench.gpu_report [--cpu] [--only NAME,...] [--peak-gbs 4800] [--host-isa avx2|native]
                                        [--work DIR]

One table row per figure, then a last line of ratios:
  decode    (a) the hot decode kernel at V4-Flash shapes (6 routes, D=4096, I=2048), several launches over
            distinct experts (no L2 reuse) replayed from one CUDA graph: GB/s of packed weights vs the
            GPU's peak (--peak-gbs)
  prefill   (b) the prefill kernel's two launches (graph-replayed) at 16..4096 routes per expert: TFLOP/s,
            and the cost model's time for the same experts and routes over the measured time
  upload    (e) pinned host-to-device copies of whole experts (13.4 MB each), as the executor issues them,
            vs the spec's link; then the executor's upload-once path over 3 groups: the share of the
            shorter of (upload, compute) that its double buffering hides
  hostnode  (d) one layer's cold-route bridge with zero cold routes: the stream fork, copies, host function,
            copy and join of the decode step, captured 32 times in one graph: its cost per layer vs the
            cost model's (two link latencies plus the activations)
  step      (c) the engine's decode step on the tiny model compiled for one H200 (bf16, at most 6 hot
            experts per layer, so cold routes cross through host nodes): ms/token replayed from its CUDA
            graphs vs run eagerly, steady state (capture and the first tokens excluded)
  bucket    (i) short prefills of 16, 64 and 120 tokens (after 100) on the same tiny engine with buckets
            8..64: the bucket steps replayed from their CUDA graphs vs the same steps eagerly vs the
            dynamic model (median of 5)
  fp8       (h) the FP8 dense kernel: a decode token through a 32768 x 1024 matrix in GB/s vs peak, a
            4096-token GEMM in TFLOP/s vs the spec
A measurement that raises becomes a failed row (exit status 1); the others still run.

Without CUDA it lists the figures as unmeasured and exits 0. `--cpu` runs every measurement on the CPU
at the tiny model's shapes (Triton's interpreter, graphs as their eager twin, no pinned memory): the
figures mean nothing there, but every code path up to the CUDA calls runs (tests/test_gpu_check_plumbing.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ostinato.bench.gpu_setup import (
    GpuSetup,
    all_hot_bridges,
    captured,
    expert_tensors,
    hot_decode_launches,
    make_setup,
    prefill_launches,
    sync,
    upload_rig,
)

ROUTES_PER_EXPERT = (16, 64, 256, 1024, 4096)
UPLOAD_GROUPS = 3


@dataclass(frozen=True)
class Row:
    name: str                 # the measurement it belongs to
    what: str
    value: str                # what was measured
    reference: str = ""       # what it is compared with
    ratio: float | None = None
    ratio_key: str = ""       # its name in the ratio line, saying what over what
    failed: bool = False      # the measurement raised
    seconds: float = 0.0      # the measurement's time, on its last row


# ----- timing ---------------------------------------------------------------------------------------
def per_call(fn, device: torch.device, n: int) -> float:
    """Seconds per call of fn over n calls after one warm-up call, by CUDA events on the current stream (what
    the device took, the host running ahead); on the CPU by the wall clock, without the warm-up (the
    plumbing run, whose figures mean nothing: Triton's interpreter is slow enough)."""
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n
    fn()
    sync(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / n


def wall(fn, device: torch.device, n: int) -> float:
    """Wall seconds per call of a host-driven fn (it syncs with the device itself), after one warm-up."""
    fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return (time.perf_counter() - start) / n


# ----- the measurements -----------------------------------------------------------------------------
def hot_decode(s: GpuSetup, peak_gbs: float) -> list[Row]:
    """(a) Hot decode launches over distinct experts, replayed from one CUDA graph."""
    cfg, n = s.cfg, (10 if s.cuda else 2)
    launches = hot_decode_launches(s, n)
    sec = per_call(captured(launches.run, s.device), s.device, 50 if s.cuda else 1) / n
    gbs = launches.bytes_per_launch / sec / 1e9
    return [Row("decode", f"(a) hot decode, {cfg.num_experts_per_tok} routes D={cfg.hidden_size} "
                f"I={cfg.moe_intermediate_size}, graph of {n} launches", f"{sec * 1e6:.1f} us/launch, {gbs:.0f} GB/s",
                f"peak {peak_gbs:.0f} GB/s", gbs / peak_gbs, "decode_bw/peak")]


def prefill_rate(s: GpuSetup, peak_gbs: float) -> list[Row]:
    """(b) The prefill kernel at r routes per expert: k experts, r tokens each routed to all of them."""
    cfg, rows = s.cfg, []
    for r in ROUTES_PER_EXPERT if s.cuda else ROUTES_PER_EXPERT[:1]:
        launches = prefill_launches(s, r)
        sec = per_call(captured(launches.run, s.device), s.device, 20 if s.cuda else 1)
        flops = s.cost.expert_flops * launches.routes
        model = s.cost.gpu_experts_time(cfg.num_experts_per_tok, launches.routes)
        rows.append(Row("prefill", f"(b) prefill, {r} routes/expert x {cfg.num_experts_per_tok} experts "
                        f"D={cfg.hidden_size} I={cfg.moe_intermediate_size}",
                        f"{flops / sec / 1e12:.1f} TFLOP/s, {sec * 1e3:.3f} ms", f"cost model {model * 1e3:.3f} ms",
                        model / sec, f"prefill{r}/model"))
    return rows


def upload(s: GpuSetup, peak_gbs: float) -> list[Row]:
    """(e) Pinned expert uploads, then the executor's upload-once path vs upload alone and compute alone."""
    T = 2048 if s.cuda else 16  # on an H200 about as long to compute as to upload (T k / n routes per expert)
    rig = upload_rig(s, UPLOAD_GROUPS, T)
    try:
        def copy_all():  # expert by expert, tensor by tensor, into the staging buffers (as the executor does)
            for i, e in enumerate(rig.experts):
                pool = rig.staging[(i // rig.group) % 2]
                for name, src in zip(("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale"), expert_tensors(e)):
                    getattr(pool, name)[i % rig.group].copy_(src.view(torch.uint8), non_blocking=True)

        n, nbytes = len(rig.experts), rig.experts[0].nbytes
        t_up = per_call(copy_all, s.device, 5 if s.cuda else 1)
        out = torch.zeros(T, s.cfg.hidden_size, device=s.device)
        t_compute = wall(lambda: rig.on_resident(out), s.device, 3 if s.cuda else 1)
        t_both = wall(rig.upload, s.device, 3 if s.cuda else 1)
    finally:
        rig.close()
    h2d, link = n * nbytes / t_up / 1e9, s.cost.hw.link.h2d_bandwidth / 1e9
    hidden = (t_up + t_compute - t_both) / min(t_up, t_compute)
    k = s.cfg.num_experts_per_tok
    return [Row("upload", f"(e) {'pinned ' if s.cuda else ''}H2D, {n} experts of {nbytes / 1e6:.1f} MB",
                f"{h2d:.1f} GB/s", f"spec link {link:.0f} GB/s", h2d / link, "h2d/link"),
            Row("upload", f"(e) upload-once, {UPLOAD_GROUPS} groups of {rig.group}, {T * k // n} routes/expert",
                f"{t_both * 1e3:.2f} ms", f"alone: upload {t_up * 1e3:.2f}, compute {t_compute * 1e3:.2f} ms",
                hidden, "overlap")]


def host_node(s: GpuSetup, peak_gbs: float) -> list[Row]:
    """(d) One layer's cold-route bridge with zero cold routes, 32 times in one graph."""
    engine = s.engine(graphs=False)
    try:
        bridges = all_hot_bridges(engine, 32 if s.cuda else 4)
        sec = per_call(captured(bridges.run, s.device), s.device, 20 if s.cuda else 2) / bridges.n
    finally:
        engine.close()
    link, act = s.cost.hw.link, bridges.hidden_size * 4
    model = 2 * link.latency_s + act / link.d2h_bandwidth + act / link.h2d_bandwidth  # as cpu_experts_time's crossing
    return [Row("hostnode", f"(d) host node per layer, 0 cold routes (tiny, D={bridges.hidden_size}), "
                f"{bridges.n} per graph", f"{sec * 1e6:.1f} us", f"cost model {model * 1e6:.1f} us", sec / model,
                "hostnode/model")]


def decode_step(s: GpuSetup, peak_gbs: float) -> list[Row]:
    """(c) The engine's decode step replayed from its CUDA graphs vs run eagerly."""
    warmup, steps, prompt = (4, 32, 100) if s.cuda else (1, 6, 24)
    engines = [s.engine(graphs=True), s.engine(graphs=False)]
    try:
        vocab = engines[0].model.config.vocab_size
        ids = torch.randint(0, vocab, (prompt,), generator=torch.Generator().manual_seed(0))
        sessions = [e.new_session() for e in engines]
        token = int(sessions[1].prefill(ids, last_only=True)[-1].argmax())
        sessions[0].prefill(ids, last_only=True)
        times = [0.0, 0.0]
        for i in range(warmup + steps):  # both fed the eager session's greedy tokens
            for j, session in enumerate(sessions):
                start = time.perf_counter()
                logits = session.decode(token)
                sync(s.device)
                if i >= warmup:
                    times[j] += time.perf_counter() - start
            token = int(logits.argmax())
    finally:
        for e in engines:
            e.close()
    graph_ms, eager_ms = (t / steps * 1e3 for t in times)
    return [Row("step", f"(c) decode step, tiny bf16, {steps} tokens after {warmup}: graph vs eager",
                f"{graph_ms:.2f} ms/token", f"eager {eager_ms:.2f} ms/token", eager_ms / graph_ms, "eager/graph")]


def bucket_steps(s: GpuSetup, peak_gbs: float) -> list[Row]:
    """(i) Short prefills as captured bucket steps vs the same steps eagerly vs the dynamic model."""
    buckets, prompt, sizes, reps = [8, 16, 32, 64], 100, (16, 64, 120), (5 if s.cuda else 1)
    plan = s.plan.replace(policy=s.plan.policy.replace(prefill_buckets=buckets))
    kinds = {"graph": (plan, True), "eager steps": (plan, False),
             "dynamic": (plan.replace(policy=plan.policy.replace(prefill_buckets=[])), False)}
    engines = {name: s.engine(graphs=g, plan=p) for name, (p, g) in kinds.items()}
    rows = []
    try:
        vocab = engines["graph"].model.config.vocab_size
        ids = torch.randint(0, vocab, (prompt + max(sizes),), generator=torch.Generator().manual_seed(1))
        for n in sizes:
            median = {}
            for name, engine in engines.items():
                times = []
                for r in range(reps + 1):  # the first run binds (and captures, for the graph engine)
                    session = engine.new_session()
                    session.prefill(ids[:prompt], last_only=True)
                    sync(s.device)
                    start = time.perf_counter()
                    session.prefill(ids[prompt:prompt + n], last_only=True)
                    sync(s.device)
                    if r:
                        times.append(time.perf_counter() - start)
                median[name] = sorted(times)[len(times) // 2] * 1e3
            g, e, d = median["graph"], median["eager steps"], median["dynamic"]
            rows.append(Row("bucket", f"(i) {n}-token prefill after {prompt}, tiny: bucket graphs vs eager steps",
                            f"{g:.2f} ms", f"eager steps {e:.2f} ms, dynamic {d:.2f} ms", d / g, f"dynamic/graph{n}"))
    finally:
        for engine in engines.values():
            engine.close()
    return rows


def fp8_dense(s: GpuSetup, peak_gbs: float) -> list[Row]:
    """(h) The FP8 dense kernel: a decode token through V4-Flash's largest dense matrix (wq_b, 32768 x 1024)
    in GB/s of FP8 bytes read, a 4096-token prefill through wo_b (4096 x 8192) in TFLOP/s."""
    from ostinato.checkpoint.formats import quantize_fp8
    from ostinato.runtime.kernels.fp8_triton import fp8_linear  # imports Triton: after TRITON_INTERPRET is set
    from ostinato.runtime.kernels.scale_layout import word_aligned

    rows = []
    shapes = ((1, 32768, 1024), (4096, 4096, 8192)) if s.cuda else ((1, 256, 128), (64, 128, 256))
    act = torch.bfloat16 if s.cuda else torch.float16  # Triton's interpreter computes bf16 wrongly
    for T, N, K in shapes:
        q, scale = quantize_fp8(torch.randn(N, K) * 0.02)
        q, x = q.to(s.device), torch.randn(T, K).to(s.device, act)
        scale = word_aligned(scale.view(torch.uint8).to(s.device))
        sec = per_call(lambda x=x, q=q, scale=scale: fp8_linear(x, q, scale), s.device, 50 if s.cuda else 1)
        if T == 1:
            gbs = N * K / sec / 1e9
            rows.append(Row("fp8", f"(h) FP8 dense GEMV {N}x{K}, 1 token", f"{sec * 1e6:.1f} us, {gbs:.0f} GB/s",
                            f"peak {peak_gbs:.0f} GB/s", gbs / peak_gbs, "fp8_gemv_bw/peak"))
        else:
            tflops, spec = 2 * T * N * K / sec / 1e12, s.plan.hardware.gpus.matmul_flops / 1e12
            rows.append(Row("fp8", f"(h) FP8 dense GEMM {T}x{N}x{K}", f"{tflops:.1f} TFLOP/s",
                            f"spec {spec:.0f} TFLOP/s", tflops / spec, "fp8_gemm_flops/spec"))
    return rows


RUNS = {"decode": hot_decode, "prefill": prefill_rate, "upload": upload, "hostnode": host_node, "step": decode_step,
        "bucket": bucket_steps, "fp8": fp8_dense}


# ----- output ---------------------------------------------------------------------------------------
def table(rows: list[Row]) -> str:
    head = ("what", "measured", "reference", "ratio", "s")
    cells = [(r.what, "FAILED: " + r.value if r.failed else r.value, r.reference,
              "" if r.ratio is None else f"{r.ratio:.3g}", f"{r.seconds:.1f}" if r.seconds else "") for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *cells]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def ratio_line(rows: list[Row]) -> str:
    return "ratios: " + (" ".join(f"{r.ratio_key}={r.ratio:.3g}" for r in rows if r.ratio_key) or "none")


def measure(name: str, setup: GpuSetup, peak_gbs: float) -> list[Row]:
    """Run one measurement; its rows are printed at once too, so a run cut short still shows them."""
    start = time.perf_counter()
    try:
        rows = RUNS[name](setup, peak_gbs)
        sync(setup.device)
    except Exception as e:  # noqa: BLE001 - one broken measurement must not cost the others
        traceback.print_exc()
        rows = [Row(name, f"{name}: raised {type(e).__name__}", str(e).splitlines()[0][:100] if str(e) else "",
                    failed=True)]
    rows[-1] = replace(rows[-1], seconds=time.perf_counter() - start)
    for r in rows:
        print(f"[{name}] {r.what}: {r.value}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU at the tiny model's shapes (plumbing)")
    ap.add_argument("--only", default=",".join(RUNS), help=f"comma-separated subset of {tuple(RUNS)}")
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="GPU memory bandwidth peak, GB/s (H200: 4800)")
    ap.add_argument("--host-isa", default="avx2", help="the tiny plan's host ISA, or 'native' (this CPU's best)")
    ap.add_argument("--work", help="folder of the tiny checkpoint, its plan and kernels, reused when there "
                                   "(the checks' OSTINATO_GPU_WORK); default: a temporary one")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    if unknown := set(names) - set(RUNS):
        ap.error(f"--only: unknown {sorted(unknown)}; choose from {tuple(RUNS)}")
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not args.cpu:
        print("gpu_report: no CUDA device: these stay UNVERIFIED (--cpu runs their CPU side):")
        for name in names:
            print(f"  {name:9s} {RUNS[name].__doc__.splitlines()[0]}")
        return 0
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is first imported, which is later
    device = torch.device("cuda" if cuda else "cpu")
    print(f"device: {torch.cuda.get_device_name(device) if cuda else 'cpu (plumbing only: figures mean nothing)'}"
          f", torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        setup = make_setup(device, Path(args.work or tmp), args.host_isa)
        print(f"set-up: tiny checkpoint and its h200-x1 plan ({setup.plan.model.dense_format}) in "
              f"{time.perf_counter() - start:.1f} s")
        rows = [row for name in names for row in measure(name, setup, args.peak_gbs)]
    failed = sum(r.failed for r in rows)
    print(table(rows))
    print(f"gpu_report: {len(names) - failed} of {len(names)} measurements ran"
          + (f", {failed} FAILED" if failed else ""))
    print(ratio_line(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
