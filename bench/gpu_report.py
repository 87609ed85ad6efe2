"""GPU throughput report: the CUDA paths' speeds on one GPU, against the GPU's peak, the hardware spec, the
cost model and the issue's goals. Their pass/fail properties are the checks in tests/gpu (`pytest -m gpu
tests/gpu`); tools/gpu_check.sh runs both on a lent GPU machine.

    python -m ostinato.bench.gpu_report [--cpu] [--only NAME,...] [--peak-gbs 4800] [--host-isa avx2|native]
                                        [--work DIR] [--table FILE] [--state FILE] [--figures FILE]
                                        [--limit-s S] [--budget-s S]

One table row per figure, then a line of ratios and a line of goals; the measurements in this order, what
matters most first (a run cut short keeps those):
  fp8       (h) the FP8 dense kernel on bf16 activations: a decode token through each distinct dense FP8
            matrix shape of V4-Flash (copies cycled in one graph, past L2) in GB/s vs peak (goal >= 0.6);
            wo_a as the engine runs it (through attention.grouped_linear, the function the attention applies
            it with, whatever that launches) against one GEMV of its shape (same goal); a 4096-token GEMM
            through wo_b in TFLOP/s vs the spec
  decode    (a) the hot decode kernel at V4-Flash shapes (6 routes, D=4096, I=2048) on bf16 activations,
            several launches over distinct experts (no L2 reuse) replayed from one CUDA graph: GB/s of
            packed weights vs the GPU's peak (--peak-gbs); goal >= 0.7
  step      (c) the engine's decode step on the tiny model compiled for one H200 (bf16, at most 6 hot
            experts per layer, so cold routes cross through host nodes): tok/s and ms/token replayed from
            its CUDA graphs vs run eagerly, steady state (capture and the first tokens excluded)
  prefill   (b) the prefill kernel's two launches (graph-replayed) at 16..4096 routes per expert on bf16
            activations (the engine's; float16 under --cpu): TFLOP/s, and the cost model's time for the
            same experts and routes over the measured time
  upload    (e) pinned host-to-device copies of whole experts (13.4 MB each), as the executor issues them,
            vs the spec's link; then the executor's upload-once path over 3 groups: the share of the
            shorter of (upload, compute) that its double buffering hides
  hostnode  (d) one layer's cold-route bridge with zero cold routes: the stream fork, copies, host function,
            copy and join of the decode step, captured 32 times in one graph: its cost per layer vs the
            cost model's (two link latencies plus the activations)
  bucket    (i) short prefills of 16, 64 and 120 tokens (after 100) on the same tiny engine as the plan's
            bucket steps (buckets 2..128: 120 = 64+32+16+8): replayed from their CUDA graphs vs the same
            steps eagerly vs the dynamic model (median of 5)
The goals measured by the checks (graphs equal eager to 1e-5 of the logit scale in float32, allocation =
plan within 5%) come from the figures file they write (tests/gpu/conftest.py, --figures).

Each measurement runs in its own process (--child NAME; bench/gpu_report_process.py), under --limit-s
seconds and within --budget-s in all: a sticky CUDA error (a misaligned address) poisons the process it
happens in, so a crash, a hang or an error costs only its own measurement, which becomes a FAILED row; the
others still run. Every row is added to the table file (--table; bench/gpu_report_table.py) as it
finishes, so a run cut short keeps what it measured; with --state the rows of an earlier part come first
(tools/gpu_check.py runs fp8, decode and step before the checks, the rest after). Exit status 1 when one of
this part's measurements failed or could not run.

Without CUDA (and without --cpu) it measures nothing, lists what stays unverified and exits 1. `--cpu` runs
every measurement on the CPU at the tiny model's shapes (Triton's interpreter, graphs as their eager twin,
no pinned memory): the figures mean nothing there, but every code path up to the CUDA calls runs
(tests/test_gpu_check_plumbing.py).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

from ostinato.bench.gpu_report_process import child, run_child
from ostinato.bench.gpu_report_table import (
    Row,
    TableFile,
    figure_rows,
    goals_line,
    ratio_line,
    table,
    unmeasured_goals,
)
from ostinato.bench.gpu_setup import (
    SHORT_PREFILLS,
    GpuSetup,
    activation_dtype,
    all_hot_bridges,
    bucket_steps,
    captured,
    dense_fp8_shapes,
    expert_tensors,
    hot_decode_launches,
    make_setup,
    prefill_launches,
    sync,
    upload_rig,
)

ROUTES_PER_EXPERT = (16, 64, 256, 1024, 4096)
UPLOAD_GROUPS = 3
ROTATE_BYTES = 256 << 20  # the FP8 GEMV cycles copies of its matrix over this many bytes: 5x an H200's L2
LIMIT_S = 120.0           # one measurement's process on CUDA, start-up included (--cpu: none; the interpreter is slow)
LEAST_S = 15.0            # a measurement with less time than this left does not start


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


# ----- the measurements: each yields its rows as they are measured ------------------------------------
def hot_decode(s: GpuSetup, peak_gbs: float) -> Iterator[Row]:
    """(a) Hot decode launches over distinct experts, replayed from one CUDA graph."""
    cfg, n = s.cfg, (10 if s.cuda else 2)
    launches = hot_decode_launches(s, n)
    sec = per_call(captured(launches.run, s.device), s.device, 50 if s.cuda else 1) / n
    gbs = launches.bytes_per_launch / sec / 1e9
    yield Row("decode", f"(a) hot decode, {cfg.num_experts_per_tok} routes D={cfg.hidden_size} "
              f"I={cfg.moe_intermediate_size}, graph of {n} launches", f"{sec * 1e6:.1f} us/launch, {gbs:.0f} GB/s",
              f"peak {peak_gbs:.0f} GB/s", gbs / peak_gbs, "decode_bw/peak")


def prefill_rate(s: GpuSetup, peak_gbs: float) -> Iterator[Row]:
    """(b) The prefill kernel at r routes per expert: k experts, r tokens each routed to all of them."""
    cfg, act = s.cfg, str(activation_dtype(s.device)).removeprefix("torch.")
    for r in ROUTES_PER_EXPERT if s.cuda else ROUTES_PER_EXPERT[:1]:
        launches = prefill_launches(s, r)
        sec = per_call(captured(launches.run, s.device), s.device, 20 if s.cuda else 1)
        flops = s.cost.expert_flops * launches.routes
        model = s.cost.gpu_experts_time(cfg.num_experts_per_tok, launches.routes)
        yield Row("prefill", f"(b) prefill, {r} routes/expert x {cfg.num_experts_per_tok} experts "
                  f"D={cfg.hidden_size} I={cfg.moe_intermediate_size}, {act}",
                  f"{flops / sec / 1e12:.1f} TFLOP/s, {sec * 1e3:.3f} ms", f"cost model {model * 1e3:.3f} ms",
                  model / sec, f"prefill{r}/model")


def upload(s: GpuSetup, peak_gbs: float) -> Iterator[Row]:
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
        h2d, link = n * nbytes / t_up / 1e9, s.cost.hw.link.h2d_bandwidth / 1e9
        yield Row("upload", f"(e) {'pinned ' if s.cuda else ''}H2D, {n} experts of {nbytes / 1e6:.1f} MB",
                  f"{h2d:.1f} GB/s", f"spec link {link:.0f} GB/s", h2d / link, "h2d/link")
        out = torch.zeros(T, s.cfg.hidden_size, device=s.device)
        t_compute = wall(lambda: rig.on_resident(out), s.device, 3 if s.cuda else 1)
        t_both = wall(rig.upload, s.device, 3 if s.cuda else 1)
    finally:
        rig.close()
    hidden = (t_up + t_compute - t_both) / min(t_up, t_compute)
    yield Row("upload", f"(e) upload-once, {UPLOAD_GROUPS} groups of {rig.group}, "
              f"{T * s.cfg.num_experts_per_tok // n} routes/expert", f"{t_both * 1e3:.2f} ms",
              f"alone: upload {t_up * 1e3:.2f}, compute {t_compute * 1e3:.2f} ms", hidden, "overlap")


def host_node(s: GpuSetup, peak_gbs: float) -> Iterator[Row]:
    """(d) One layer's cold-route bridge with zero cold routes, 32 times in one graph."""
    engine = s.engine(graphs=False)
    try:
        bridges = all_hot_bridges(engine, 32 if s.cuda else 4)
        sec = per_call(captured(bridges.run, s.device), s.device, 20 if s.cuda else 2) / bridges.n
    finally:
        engine.close()
    link, act = s.cost.hw.link, bridges.hidden_size * 4
    model = 2 * link.latency_s + act / link.d2h_bandwidth + act / link.h2d_bandwidth  # as cpu_experts_time's crossing
    yield Row("hostnode", f"(d) host node per layer, 0 cold routes (tiny, D={bridges.hidden_size}), "
              f"{bridges.n} per graph", f"{sec * 1e6:.1f} us", f"cost model {model * 1e6:.1f} us", sec / model,
              "hostnode/model")


def decode_step(s: GpuSetup, peak_gbs: float) -> Iterator[Row]:
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
        dtype = str(engines[0].model.dtype).removeprefix("torch.")
    finally:
        for e in engines:
            e.close()
    graph_ms, eager_ms = (t / steps * 1e3 for t in times)
    yield Row("step", f"(c) decode step, tiny {dtype}, {steps} tokens after {warmup}: graph vs eager",
              f"{1e3 / graph_ms:.0f} tok/s, {graph_ms:.2f} ms/token", f"eager {eager_ms:.2f} ms/token",
              eager_ms / graph_ms, "eager/graph")


def bucket_rate(s: GpuSetup, peak_gbs: float) -> Iterator[Row]:
    """(i) Short prefills as the plan's bucket steps: replayed from graphs vs run eagerly vs the dynamic model."""
    prompt, reps, plan = 100, (5 if s.cuda else 1), s.plan
    kinds = {"graph": (plan, True), "eager steps": (plan, False),
             "dynamic": (plan.replace(policy=plan.policy.replace(prefill_buckets=[])), False)}
    engines = {name: s.engine(graphs=g, plan=p) for name, (p, g) in kinds.items()}
    try:
        vocab = engines["graph"].model.config.vocab_size
        ids = torch.randint(0, vocab, (prompt + max(SHORT_PREFILLS),), generator=torch.Generator().manual_seed(1))
        for n in SHORT_PREFILLS:
            median, pieces = {}, []
            for name, engine in engines.items():
                times = []
                for r in range(reps + 1):  # the first run binds (and captures, for the graph engine)
                    session = engine.new_session()
                    session.prefill(ids[:prompt], last_only=True)
                    if name != "dynamic":  # what the engine runs: raises unless these are bucket steps
                        pieces = bucket_steps(session, plan, n)
                    sync(s.device)
                    start = time.perf_counter()
                    session.prefill(ids[prompt:prompt + n], last_only=True)
                    sync(s.device)
                    if r:
                        times.append(time.perf_counter() - start)
                median[name] = sorted(times)[len(times) // 2] * 1e3
            g, e, d = median["graph"], median["eager steps"], median["dynamic"]
            yield Row("bucket", f"(i) {n}-token prefill after {prompt}, tiny: bucket steps "
                      f"{'+'.join(map(str, pieces))}, graphs vs eager", f"{g:.2f} ms",
                      f"eager steps {e:.2f} ms, dynamic {d:.2f} ms", d / g, f"dynamic/graph{n}")
    finally:
        for engine in engines.values():
            engine.close()


def fp8_dense(s: GpuSetup, peak_gbs: float) -> Iterator[Row]:
    """(h) The FP8 dense kernel on the engine's activations: a GEMV per dense FP8 shape, a 4096-token GEMM.
    A decode token through every distinct dense FP8 matrix shape (GB/s of weights and scales read, copies
    cycled past L2 in one graph), then a 4096-token prefill through wo_b (4096 x 8192 on V4-Flash)."""
    from ostinato.runtime.kernels.fp8_triton import fp8_linear  # imports Triton: after TRITON_INTERPRET is set

    dev, act, g = s.device, activation_dtype(s.device), torch.Generator().manual_seed(5)
    shapes, gemv_seconds = dense_fp8_shapes(s.cfg), {}
    for (N, K), names in shapes.items():
        copies = fp8_copies(s, N, K)
        mats, x = fp8_weights(N, K, copies, dev, g), torch.randn(1, K, generator=g).to(dev, act)

        def run(mats=mats, x=x):
            for q, scale in mats:
                fp8_linear(x, q, scale)

        sec = gemv_seconds[N, K] = per_call(captured(run, dev), dev, 20 if s.cuda else 1) / copies
        gbs = (N * K + mats[0][1].numel()) / sec / 1e9
        yield Row("fp8", f"(h) FP8 GEMV {N}x{K} ({', '.join(names)}), 1 token, graph of {copies}",
                  f"{sec * 1e6:.1f} us, {gbs:.0f} GB/s", f"peak {peak_gbs:.0f} GB/s", gbs / peak_gbs,
                  f"fp8_gemv_bw/peak:{N}x{K}")
    yield from wo_a_as_run(s, peak_gbs, gemv_seconds[next(shape for shape, names in shapes.items() if "wo_a" in names)])
    (N, K), T = next(shape for shape, names in shapes.items() if "wo_b" in names), (4096 if s.cuda else 64)
    q, scale = fp8_weights(N, K, 1, dev, g)[0]
    x = torch.randn(T, K, generator=g).to(dev, act)
    sec = per_call(lambda: fp8_linear(x, q, scale), dev, 20 if s.cuda else 1)
    tflops, spec = 2 * T * N * K / sec / 1e12, s.plan.hardware.gpus.matmul_flops / 1e12
    yield Row("fp8", f"(h) FP8 GEMM {T}x{N}x{K} (wo_b)", f"{tflops:.1f} TFLOP/s", f"spec {spec:.0f} TFLOP/s",
              tflops / spec, "fp8_gemm_flops/spec")


def fp8_copies(s: GpuSetup, N: int, K: int) -> int:
    """Copies of an N x K FP8 matrix a timed graph cycles through: ROTATE_BYTES of them, past L2."""
    return max(2, math.ceil(ROTATE_BYTES / (N * K))) if s.cuda else 2


def fp8_weights(N: int, K: int, copies: int, dev: torch.device, g: torch.Generator) -> list[tuple]:
    """`copies` copies of one random N x K FP8 matrix, (q, scale) each, the scales laid out on words as the
    loader holds them."""
    from ostinato.checkpoint.formats import quantize_fp8
    from ostinato.runtime.kernels.scale_layout import word_aligned

    q, scale = quantize_fp8(torch.randn(N, K, generator=g) * 0.02)
    q, scale = q.to(dev), scale.view(torch.uint8).to(dev)
    return [(q.clone(), word_aligned(scale.clone())) for _ in range(copies)]


def wo_a_as_run(s: GpuSetup, peak_gbs: float, gemv_s: float) -> Iterator[Row]:
    """(h) wo_a as a decode token's attention applies it: through the function the attention module calls with
    it (attention.grouped_linear, looked up there at each call, so this row times whatever the engine
    launches), on an Fp8Matrix held as the loader holds it and the attention's grouped view of its heads'
    outputs; against `gemv_s`, one GEMV of the same shape."""
    from ostinato.runtime.model import attention  # imports Triton on CUDA: after TRITON_INTERPRET is set
    from ostinato.runtime.model.fp8_matrix import Fp8Matrix

    dev, act, cfg = s.device, activation_dtype(s.device), s.cfg
    (N, K), G = next(shape for shape, names in dense_fp8_shapes(cfg).items() if "wo_a" in names), cfg.o_groups
    copies = fp8_copies(s, N, K)
    mats = [Fp8Matrix.of_bytes(q, scale) for q, scale in fp8_weights(N, K, copies, dev, torch.Generator())]
    o = torch.randn(1, G * K, generator=torch.Generator().manual_seed(6)).to(dev, act)  # [T, H*hd]
    grouped = o.reshape(1, G, -1).transpose(0, 1)  # [G, T, H*hd/G]: the attention's view

    def run():
        for w in mats:
            attention.grouped_linear(grouped, w)  # [G, T, ol]

    sec = per_call(captured(run, dev), dev, 20 if s.cuda else 1) / copies
    gbs = (N * K + mats[0].scale.numel()) / sec / 1e9
    yield Row("fp8", f"(h) wo_a as the engine runs it: grouped_linear, {G} groups of {N // G}x{K}, 1 token, "
              f"graph of {copies}", f"{sec * 1e6:.1f} us, {gbs:.0f} GB/s",
              f"one {N}x{K} GEMV {gemv_s * 1e6:.1f} us; peak {peak_gbs:.0f} GB/s", gbs / peak_gbs,
              "fp8_gemv_bw/peak:wo_a_as_run")


# In the order they run: the figures that matter most first (a run cut short keeps them).
RUNS = {"fp8": fp8_dense, "decode": hot_decode, "step": decode_step, "prefill": prefill_rate, "upload": upload,
        "hostnode": host_node, "bucket": bucket_rate}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU at the tiny model's shapes (plumbing)")
    ap.add_argument("--only", default=",".join(RUNS), help=f"comma-separated subset of {tuple(RUNS)}")
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="GPU memory bandwidth peak, GB/s (H200: 4800)")
    ap.add_argument("--host-isa", default="avx2", help="the tiny plan's host ISA, or 'native' (this CPU's best)")
    ap.add_argument("--work", help="folder of the tiny checkpoint, its plans and kernels, reused when there "
                                   "(the checks' OSTINATO_GPU_WORK); default: a temporary one")
    ap.add_argument("--table", type=Path, default=Path(os.environ.get("OUT", "build/gpu_check")) / "report_table.txt",
                    help="the table file, rewritten as each row finishes (default $OUT/report_table.txt)")
    ap.add_argument("--state", type=Path, help="the rows so far (JSON lines): an earlier run's rows are kept and "
                                               "this run's added (the device script runs the report in two parts)")
    ap.add_argument("--figures", type=Path, default=os.environ.get("OSTINATO_GPU_FIGURES"),
                    help="the checks' figures (JSON lines; default $OSTINATO_GPU_FIGURES): their goals' rows")
    ap.add_argument("--limit-s", type=float, help=f"time limit of one measurement's process (default {LIMIT_S:g}; "
                                                   "--cpu: none)")
    ap.add_argument("--budget-s", type=float, default=math.inf, help="time for all of them; then none starts")
    ap.add_argument("--child", choices=tuple(RUNS), help=argparse.SUPPRESS)  # one measurement, in this process
    ap.add_argument("--rows", help=argparse.SUPPRESS)                        # --child's rows file
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    if unknown := set(names) - set(RUNS):
        ap.error(f"--only: unknown {sorted(unknown)}; choose from {tuple(RUNS)}")
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton is first imported (later; children inherit it)
        os.environ.setdefault("OSTINATO_CPU_STEP", "eager")  # the graphs' eager twin, not a torch.compile'd step
    if args.child:
        return child(args, RUNS)
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_report: no CUDA device: nothing measured; these stay UNVERIFIED (--cpu runs their CPU side):")
        for name in names:
            print(f"  {name:9s} {RUNS[name].__doc__.splitlines()[0]}")
        return 1
    deadline = time.monotonic() + args.budget_s
    limit = args.limit_s or (math.inf if args.cpu else LIMIT_S)
    print(f"device: {torch.cuda.get_device_name() if not args.cpu else 'cpu (plumbing only: figures mean nothing)'}"
          f", torch {torch.__version__}")
    out = TableFile(args.table, args.state)
    out.drop({"checks", "goals"})  # an earlier part's judgement of the checks' figures: judged again at the end
    mine, total = set(names), len(set(names) | {r.name for r in out.rows if r.name in RUNS})
    with tempfile.TemporaryDirectory() as tmp:
        work, start = Path(args.work or tmp), time.perf_counter()
        try:  # here, not in each child: the first would write the checkpoint and plans while the rest wait
            setup = make_setup(torch.device("cpu" if args.cpu else "cuda"), work, args.host_isa)
            print(f"set-up: tiny checkpoint and its h200-x1 plans ({setup.plan.model.dense_format}, "
                  f"{setup.plan_f32.model.dense_format}) in {time.perf_counter() - start:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - every measurement fails, each says so
            traceback.print_exc()
            out.add([Row(n, f"{n}: set-up raised {type(e).__name__}", str(e)[:100], failed=True) for n in names])
            names = []
        for name in names:
            left = deadline - time.monotonic()
            if left < LEAST_S:
                out.add([Row(name, f"{name}: not run", f"out of time ({left:.0f} s left)", failed=True)])
                continue
            run_child(name, args, work, Path(tmp), min(limit, left), out)
    out.add(figure_rows(args.figures))
    out.add(unmeasured_goals(out.rows))
    failed = sorted({r.name for r in out.rows if r.failed})
    summary = (f"gpu_report: {total - len(failed)} of {total} measurements ran"
               + (f", {len(failed)} FAILED: {' '.join(failed)}" if failed else ""))
    lines = (summary, ratio_line(out.rows), goals_line(out.rows))
    out.write(*lines)
    print(f"gpu_report: the table, also in {out.path}:")
    print(table(out.rows))
    print("\n".join(lines))
    return 1 if mine & set(failed) else 0  # this part's measurements: an earlier part said its own


if __name__ == "__main__":
    sys.exit(main())
