"""A 32K-token session at V4-Flash's real dimensions: chunked prefill, memory against context, one run.

    python -m ostinato.bench.long_context [--tokens 32768] [--chunk 4096] [--layers 3] [--experts 6] [--dtype bfloat16]

The slice's first three layers are V4-Flash's (sliding, sliding, CSA), so the CSA layer's compressor
and indexer run for real: at 32K tokens it holds 8,192 compressed rows and its indexer keeps 512 of
them per query. The session prefills the context chunk by chunk (each chunk attends to the cache the
earlier ones left) and after each chunk prints the cache's bytes, its growth per token beside the
model's KV size (docs/model.md 4.4: compressed rows and index keys of CSA layers grow; the sliding
window and compressor state stay constant), the process's RSS and peak RSS, and the chunk's time.
Memory linear in the context shows as a constant growth per token and an RSS that rises by it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MIB = 1024**2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=6)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--work", default=str(REPO / "build" / "long-context"))
    a = ap.parse_args()
    ckpt = Path(a.work) / f"flash-{a.layers}x{a.experts}"
    if not (ckpt / "config.json").exists():
        subprocess.run([sys.executable, "-m", "ostinato.cli.make_tiny", str(ckpt), "--preset", "flash", "--layers",
                        str(a.layers), "--experts", str(a.experts), "--force", "--quiet"], check=True)

    from ostinato.runtime import load_model
    from ostinato.runtime.engine.resident import resident

    dtype = getattr(torch, a.dtype)
    model = load_model(ckpt, dtype=dtype, prefill_chunk=a.chunk)
    cfg = model.config
    elt = torch.finfo(dtype).bits // 8
    csa = [l for l in range(cfg.num_hidden_layers) if cfg.compress_ratio(l) == 4]
    hca = [l for l in range(cfg.num_hidden_layers) if cfg.compress_ratio(l) == 128]
    per_token = (len(csa) * (cfg.head_dim + cfg.index_head_dim) / 4 + len(hca) * cfg.head_dim / 128) * elt
    print(f"slice: {cfg.num_hidden_layers} layers "
          f"({', '.join(cfg.attention_kind(l) for l in range(cfg.num_hidden_layers))}), "
          f"{cfg.n_routed_experts} experts, {a.dtype}; expected cache growth {per_token:.0f} B/token "
          f"(CSA rows + index keys at {elt} B per element)")
    print(f"after load: {resident()}")
    print(f"{'tokens':>7s} {'rows':>6s} {'kept':>5s} {'cache MiB':>10s} {'B/token':>8s} {'RSS MiB':>8s} "
          f"{'peak MiB':>9s} {'chunk s':>8s}")
    session = model.new_session()
    gen = torch.Generator().manual_seed(0)
    done, first = 0, None
    while done < a.tokens:
        n = min(a.chunk, a.tokens - done)
        t0 = time.perf_counter()
        session.prefill(torch.randint(0, cfg.vocab_size, (n,), generator=gen), last_only=True)
        seconds = time.perf_counter() - t0
        done += n
        size = session.cache.nbytes
        growing = size["growing"]
        first = first or (done, growing)
        rate = (growing - first[1]) / (done - first[0]) if done > first[0] else float("nan")
        mem = resident()
        rows = done // 4 if csa else 0
        print(f"{done:7d} {rows:6d} {min(rows, cfg.index_topk):5d} {(growing + size['constant']) / MIB:10.1f} "
              f"{rate:8.1f} {mem.rss / MIB:8.0f} {mem.peak / MIB:9.0f} {seconds:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
