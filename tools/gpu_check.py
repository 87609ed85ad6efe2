"""GPU check of the generated Triton expert kernels (hot experts).

With CUDA: renders both variants, runs them on the GPU against the float32 torch reference (small
shape and DeepSeek-V4-Flash's D=4096, I=2048), then times the decode variant (the hot decode path)
and reports its weight bandwidth: packed MXFP4 bytes of the experts it reads / time, against the
GPU's peak (--peak-gbs, default: H200 4800 GB/s); then captures the fixed-shape decode launch as a
CUDA graph and checks replays against eager launches; finally the engine's whole decode step: the
tiny model compiled for one H200 with at most 6 hot experts per layer (so cold routes cross to the
CPU through the graph's host nodes), each token replayed from the captured graph, compared with the
same step run eagerly and with the plain float32 model on the CPU (logits and greedy tokens), and
timed against the eager step. Without CUDA it says the GPU paths are unverified and exits 0.

Usage: python tools/gpu_check.py [--peak-gbs 4800] [--build-root DIR]
"""

from __future__ import annotations

import argparse
import re
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="GPU memory bandwidth peak, GB/s")
    ap.add_argument("--build-root", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device: the Triton expert kernels' GPU paths are UNVERIFIED "
              "(they are tested only under TRITON_INTERPRET=1 on CPU)")
        return 0

    from ostinato.compiler.codegen.kernels import TritonExpertParams, render_triton_experts
    from ostinato.runtime.kernels import triton_experts as tx
    from ostinato.runtime.kernels.reference import moe_experts_reference
    from ostinato.runtime.kernels.routes import group_routes
    from ostinato.runtime.kernels.testing import random_packed_expert

    dev = "cuda"
    print(f"device: {torch.cuda.get_device_name()}")
    failures = 0
    for (D, I, E, T) in ((256, 128, 8, 40), (4096, 2048, 8, 24)):
        g = torch.Generator().manual_seed(D)
        experts = [random_packed_expert(D, I, g) for _ in range(E)]
        pool = tx.HotPool.stack(experts, dev)
        ids = torch.stack([torch.randperm(E, generator=g)[:6] for _ in range(T)])
        routes = group_routes(ids, torch.rand(T, 6, generator=g), E)
        x = torch.randn(T, D, generator=g)
        ref = moe_experts_reference(x, routes, experts, torch.zeros(T, D))
        R = routes.token.numel()
        pre = tx.load_triton_module(render_triton_experts(
            TritonExpertParams(D, I, "prefill", block_m=16, block_n=64, block_k=64), args.build_root).path)
        dec = tx.load_triton_module(render_triton_experts(  # 8 padding routes
            TritonExpertParams(D, I, "decode", block_n=64, block_k=64, max_routes=R + 8), args.build_root).path)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            xd = x.to(dtype)
            ref_d = moe_experts_reference(xd.float(), routes, experts, torch.zeros(T, D)) if dtype != torch.float32 else ref
            out = tx.prefill_experts(pre, xd.to(dev), routes, pool, torch.zeros(T, D, device=dev))
            slot = torch.full((R + 8,), -1, dtype=torch.int32)
            slot[:R] = torch.repeat_interleave(torch.arange(E), routes.counts()).int()
            tok = torch.zeros(R + 8, dtype=torch.int32)
            tok[:R] = routes.token.int()
            wgt = torch.zeros(R + 8)
            wgt[:R] = routes.weight
            h = torch.empty(R + 8, I, device=dev)
            out_d = tx.decode_experts(dec, xd.to(dev), slot.to(dev), tok.to(dev), wgt.to(dev), pool,
                                      torch.zeros(T, D, device=dev), h)
            for name, o in (("prefill", out), ("decode", out_d)):
                err = ((o.cpu() - ref_d).abs().max() / ref_d.abs().max()).item()
                ok = err <= 1e-4
                failures += not ok
                print(f"  D={D} I={I} {name:7s} {str(dtype):15s} rel err {err:.2e} {'ok' if ok else 'FAIL'}")

    # Hot decode bandwidth: 6 routes (one token, top-6) over a pool of 64 experts, one expert per route.
    D, I, P = 4096, 2048, 64
    g = torch.Generator().manual_seed(1)
    pool = tx.HotPool.stack([random_packed_expert(D, I, g) for _ in range(P)], dev)
    dec = tx.load_triton_module(render_triton_experts(
        TritonExpertParams(D, I, "decode", block_n=64, block_k=64, max_routes=6), args.build_root).path)
    x = torch.randn(1, D, device=dev)
    out = torch.zeros(1, D, device=dev)
    h = torch.empty(6, I, device=dev)
    tok, wgt = torch.zeros(6, dtype=torch.int32, device=dev), torch.ones(6, device=dev)
    slots = [torch.arange(6 * i, 6 * i + 6, dtype=torch.int32, device=dev) % P for i in range(P)]
    for s in slots[:3]:
        tx.decode_experts(dec, x, s, tok, wgt, pool, out, h)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 200
    start.record()
    for i in range(n):
        tx.decode_experts(dec, x, slots[i % P], tok, wgt, pool, out, h)
    end.record()
    torch.cuda.synchronize()
    sec = start.elapsed_time(end) / 1e3 / n
    expert_bytes = 3 * I * D // 2 + 3 * I * D // 32
    gbs = 6 * expert_bytes / sec / 1e9
    print(f"hot decode (6 routes, D={D} I={I}): {sec * 1e6:.1f} us/step, {gbs:.0f} GB/s of packed weights "
          f"= {gbs / args.peak_gbs:.0%} of {args.peak_gbs:.0f} GB/s peak")
    failures += _decode_graph(dec, pool, D, I, P, dev)
    failures += _decode_step_graph()
    print("gpu_check: " + ("OK" if failures == 0 else f"{failures} FAILED"))
    return 1 if failures else 0


def _decode_graph(dec, pool, D: int, I: int, P: int, dev: str) -> int:
    """Capture the fixed-shape hot decode launch once as a CUDA graph, replay it with new routes written
    into the captured buffers, and compare with eager launches (the decode step's expert part)."""
    from ostinato.runtime.kernels import triton_experts as tx

    g = torch.Generator().manual_seed(2)
    x, out, h = torch.zeros(1, D, device=dev), torch.zeros(1, D, device=dev), torch.empty(6, I, device=dev)
    slot, tok, wgt = (torch.zeros(6, dtype=torch.int32, device=dev), torch.zeros(6, dtype=torch.int32, device=dev),
                      torch.zeros(6, device=dev))
    tx.decode_experts(dec, x, slot, tok, wgt, pool, out, h)  # compile before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tx.decode_experts(dec, x, slot, tok, wgt, pool, out, h)
    worst = 0.0
    for _ in range(5):
        new_x = torch.randn(1, D, generator=g).to(dev)
        new_slot = torch.randperm(P, generator=g)[:6].int().to(dev)
        new_slot[-1] = -1  # a masked padding route, as when a route is cold
        new_w = torch.rand(6, generator=g).to(dev)
        x.copy_(new_x), slot.copy_(new_slot), wgt.copy_(new_w), out.zero_()
        graph.replay()
        eager = tx.decode_experts(dec, new_x, new_slot, tok.clone(), new_w, pool, torch.zeros(1, D, device=dev),
                                  torch.empty(6, I, device=dev))
        torch.cuda.synchronize()
        worst = max(worst, ((out - eager).abs().max() / eager.abs().max().clamp(min=1e-30)).item())
    ok = worst <= 1e-5
    print(f"decode graph: captured once, replayed 5x with new routes: max rel diff vs eager {worst:.2e} "
          f"{'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


def _decode_step_graph(prompt: int = 100, tokens: int = 24) -> int:
    """The whole per-GPU decode step as a CUDA graph (cold routes as host nodes) vs eager vs the CPU model."""
    import tempfile
    import time
    from pathlib import Path

    from ostinato.compiler.compile import CompileOptions, compile_plan
    from ostinato.isa import detect_isa
    from ostinato.plans import plans_dir
    from ostinato.runtime import load_model
    from ostinato.runtime.engine.loader import load_engine
    from ostinato.tiny import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = write_tiny_checkpoint(work / "tiny", "tiny", seed=0, progress=False)
        # the h200-x1 preset, with the host ISA of this machine (the preset's may be one it lacks)
        spec = re.sub(r"(?m)^  isa: \S+", f"  isa: {detect_isa()}",
                      (plans_dir() / "hardware" / "h200-x1.yaml").read_text())
        (work / "hardware.yaml").write_text(spec)
        plan = compile_plan(CompileOptions(ckpt, work / "plan.yaml", str(work / "hardware.yaml"), context=4096,
                                           max_hot_per_layer=6, kernel_dir=work / "kernels")).plan
        graph = load_engine(plan, ckpt, decode_graphs=True)
        eager = load_engine(plan, ckpt, decode_graphs=False)
        reference = load_model(ckpt)
        ids = torch.randint(0, reference.config.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0))
        sessions = [e.new_session() for e in (graph, eager)] + [reference.new_session()]
        nxt = [int(s.prefill(ids)[-1].argmax()) for s in sessions]
        worst, same, times = 0.0, nxt[0] == nxt[2], [0.0, 0.0]
        for _ in range(tokens):
            outs = []
            for j, s in enumerate(sessions):
                start = time.perf_counter()
                outs.append(s.decode(nxt[2]).float().cpu())
                if j < 2:
                    times[j] += time.perf_counter() - start
            scale = outs[2].abs().max()
            worst = max(worst, *(((o - outs[2]).abs().max() / scale).item() for o in outs[:2]))
            same &= int(outs[0].argmax()) == int(outs[2].argmax()) == int(outs[1].argmax())
            nxt = [int(outs[2].argmax())] * 3
        c = graph.executor.counters
        for e in (graph, eager):
            e.close()
    ok = worst <= 1e-4 and same and c.routes_cold > 0
    print(f"decode step graph (tiny, cold routes {c.routes_cold} of {c.routes}): max rel diff vs the CPU model "
          f"{worst:.2e}, greedy tokens {'identical' if same else 'DIFFER'}; graph {times[0] / tokens * 1e3:.2f} ms/token"
          f" vs eager {times[1] / tokens * 1e3:.2f} ms/token ({times[1] / max(times[0], 1e-12):.2f}x) "
          f"{'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
