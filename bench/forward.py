"""Tokens/s of Ostinato's DeepSeek-V4 forward against transformers' on the same checkpoint, one run.

Ostinato's decode runs two ways: the model's own forward on its growing cache ("ostinato"), and the
fixed-shape decode step that a CUDA graph captures on GPUs, here eager ("ostinato-static": static
buffers sized for the context, attention over all of them, masked).

    python -m ostinato.bench.forward [CKPT_DIR] [--prefill 512] [--decode 64] [--repeats 5] [--threads N]

Without CKPT_DIR a tiny checkpoint is written to a temporary directory. Both models run in float32
on the CPU with the same torch thread count. prefill = one forward over the prompt; decode = token
by token on top of the prompt's cache (each side's own cache). Shared machines are noisy, so the
two sides alternate, repeat by repeat, and the best time of each is kept: read the ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class Ours:
    name = "ostinato"

    def __init__(self, ckpt: Path):
        from ostinato.runtime import load_model

        self.model = load_model(ckpt, dtype=torch.float32)

    def prefill(self, prompt: torch.Tensor) -> float:
        return _timed(lambda: self.model.new_session().prefill(prompt))

    def decode(self, prompt: torch.Tensor, steps: list[int]) -> float:
        session = self.model.new_session()
        session.prefill(prompt)

        def run():
            for tok in steps:
                session.decode(tok)

        return _timed(run)


class OursStatic(Ours):
    name = "ostinato-static"

    def decode(self, prompt: torch.Tensor, steps: list[int]) -> float:
        from ostinato.runtime.model.static_decode import StaticStep

        session = self.model.new_session()
        session.prefill(prompt)
        step = StaticStep(self.model, max_context=prompt.numel() + len(steps))
        step.load(session.cache)

        def run():
            for tok in steps:
                step.set_tokens([tok])
                step.run()

        return _timed(run)


class Reference:
    name = "transformers"

    def __init__(self, ckpt: Path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor) -> float:
        return _timed(lambda: self.model(prompt[None]))

    @torch.no_grad()
    def decode(self, prompt: torch.Tensor, steps: list[int]) -> float:
        cache = self.model(prompt[None], use_cache=True).cache

        def run():
            c = cache
            for tok in steps:
                c = self.model(torch.tensor([[tok]]), cache=c, use_cache=True).cache

        return _timed(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", nargs="?", help="checkpoint directory (default: a fresh tiny one)")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads for both (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = None
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    if ckpt is None:
        from ostinato.tiny import write_tiny_checkpoint

        tmp = tempfile.TemporaryDirectory()
        ckpt = write_tiny_checkpoint(Path(tmp.name) / "tiny", "tiny", seed=0, progress=False)
    from ostinato.checkpoint.config import ModelConfig

    vocab = ModelConfig.from_json(ckpt).vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (args.prefill,), generator=g)
    steps = torch.randint(0, vocab, (args.decode,), generator=g).tolist()

    sides = [Ours(ckpt), OursStatic(ckpt), Reference(ckpt)]
    for side in sides:
        side.prefill(prompt[:16])  # warm-up
    best = {(s.name, phase): float("inf") for s in sides for phase in ("prefill", "decode")}
    for _ in range(args.repeats):
        for side in sides:  # alternate so both sides see the same machine conditions
            best[side.name, "prefill"] = min(best[side.name, "prefill"], side.prefill(prompt))
            best[side.name, "decode"] = min(best[side.name, "decode"], side.decode(prompt, steps))

    print(f"checkpoint: {ckpt}  threads: {torch.get_num_threads()}  best of {args.repeats}, alternating")
    print(f"{'phase':<8} {'tokens':>6} " + " ".join(f"{s.name + ' tok/s':>21}" for s in sides)
          + "   (ratio to transformers)")
    for phase, n in (("prefill", args.prefill), ("decode", args.decode)):
        ref = best["transformers", phase]
        cells = [f"{n / best[s.name, phase]:>11.1f} ({ref / best[s.name, phase]:>5.2f}x)" for s in sides]
        print(f"{phase:<8} {n:>6} " + " ".join(f"{c:>21}" for c in cells))
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
