"""Prompt and decode tokens/s of a plan's engine on this machine's CPU, the shape llama.cpp's
llama-bench reports: a P-token prompt in one prefill, then G greedy tokens one at a time.

    python -m ostinato.bench.engine_speed PLAN [--prompt 512] [--generate 64] [--repeats 3]
        [--vs-prompt TOK_S --vs-decode TOK_S --vs-label TEXT]

Each repeat is a fresh session (the prompt runs as the plan says: split-route or upload-once); the
best repeat of each phase is kept (shared machines are noisy). `--vs-*` prints ratios to another
system's figures measured elsewhere (say where in --vs-label): a ratio to numbers from another run,
not a side-by-side measurement.
Last line: `prompt_tok_s=A decode_tok_s=B` (plus `prompt_ratio=.. decode_ratio=..` with --vs-*).
"""

from __future__ import annotations

import argparse
import time

import torch

from ostinato.runtime.engine.loader import load_engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--generate", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vs-prompt", type=float, help="the other system's prompt tokens/s")
    p.add_argument("--vs-decode", type=float, help="the other system's decode tokens/s")
    p.add_argument("--vs-label", default="the other system")
    a = p.parse_args()
    engine = load_engine(a.plan, device="cpu", speculative="off")  # plain decoding: what it measures
    vocab = engine.model.config.vocab_size
    prompt = torch.randint(0, vocab, (a.prompt,), generator=torch.Generator().manual_seed(0))
    best_prompt = best_decode = float("inf")
    try:
        for _ in range(a.repeats):
            session = engine.new_session()
            t = time.perf_counter()
            token = int(session.prefill(prompt, last_only=True)[-1].argmax())
            best_prompt = min(best_prompt, time.perf_counter() - t)
            t = time.perf_counter()
            for _ in range(a.generate):
                token = int(session.decode(token).argmax())
            best_decode = min(best_decode, time.perf_counter() - t)
    finally:
        engine.close()
    prompt_rate, decode_rate = a.prompt / best_prompt, a.generate / best_decode
    print(f"plan {a.plan}: {engine.plan.model.layers} layers, {a.prompt}-token prompt + {a.generate} generated, "
          f"{torch.get_num_threads()} torch threads, best of {a.repeats}")
    print(f"prompt: {prompt_rate:8.1f} tok/s   decode: {decode_rate:6.1f} tok/s")
    line = f"prompt_tok_s={prompt_rate:.1f} decode_tok_s={decode_rate:.1f}"
    if a.vs_prompt and a.vs_decode:
        print(f"vs {a.vs_label} ({a.vs_prompt:.0f} / {a.vs_decode:.0f} tok/s, measured elsewhere): "
              f"prompt {prompt_rate / a.vs_prompt:.2f}x, decode {decode_rate / a.vs_decode:.2f}x")
        line += f" prompt_ratio={prompt_rate / a.vs_prompt:.3f} decode_ratio={decode_rate / a.vs_decode:.3f}"
    print(line)


if __name__ == "__main__":
    main()
