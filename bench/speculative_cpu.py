"""MTP speculative decoding on the CPU, measured side by side with plain decoding (issue #30).

    python -m ostinato.bench.speculative_cpu                       # the tiny preset, written to a temp dir
    python -m ostinato.bench.speculative_cpu --model DIR --rounds 5

The same prompt and reply length run as plain greedy decoding and as speculative decoding
(runtime/model/speculative.py) with drafts forced to a given acceptance (the known greedy continuation,
replaced by a wrong token on a fixed schedule), alternating in every round so both see the same machine
load. Printed per mode: tok/s (median over rounds), the ratio to plain decoding, and the per-step costs
the ratio comes from: a one-token decode step, the two-token verify step, the MTP draft. All on the
plain float32 model (load_model, dense experts): what the speculative step costs relative to a decode
step on this CPU, not a GPU figure. Every mode's tokens are checked equal to plain decoding's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def _plain(model, prompt: list[int], n: int) -> tuple[list[int], float]:
    s = model.new_session()
    out = [int(s.prefill(prompt, last_only=True)[-1].argmax())]
    t0 = time.perf_counter()
    while len(out) < n:
        out.append(int(s.decode(out[-1]).argmax()))
    return out, time.perf_counter() - t0


def _speculative(model, prompt: list[int], n: int, draft) -> tuple[list[int], float, object]:
    from ostinato.runtime.model.speculative import SpeculativeDecoder

    spec = SpeculativeDecoder(model.new_session(), draft=draft)
    out = spec.start(spec.prefill(prompt)[-1])
    t0 = time.perf_counter()
    while len(out) < n:
        out += spec.step()
    return out[:n], time.perf_counter() - t0, spec


def _step_costs(model, prompt: list[int], reps: int) -> dict[str, list[float]]:
    """Seconds of `reps` decode steps, two-token verify steps and MTP drafts after the prompt, alternating."""
    from ostinato.runtime.model.mtp import mtp_logits

    s = model.new_session()
    s.prefill(prompt)
    mark, times = s.mark(), {"decode": [], "verify": [], "draft": []}
    mtp_cache = model.new_mtp_cache()
    streams = model.forward(torch.tensor(prompt[-2:]), model.new_cache(), with_streams=True)[1][:1]
    for _ in range(reps):
        for name, fn in (("decode", lambda: s.extend([prompt[0]])), ("verify", lambda: s.extend(prompt[:2]))):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            s.back_to(mark)
        m = mtp_cache.snapshot()
        t0 = time.perf_counter()
        mtp_logits(model, streams, torch.tensor(prompt[-1:]), len(prompt) - 1, mtp_cache)
        times["draft"].append(time.perf_counter() - t0)
        mtp_cache.restore(m)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="a checkpoint with an MTP block (default: write the tiny preset)")
    p.add_argument("--prompt", type=int, default=200, help="prompt tokens (200)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per run (64)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every mode once (3)")
    p.add_argument("--acceptance", default="1.0,0.9,0.0", help="forced acceptance rates (1.0,0.9,0.0)")
    a = p.parse_args(argv)
    from ostinato.runtime import load_model
    from ostinato.tiny import write_tiny_checkpoint

    torch.set_grad_enabled(False)
    tmp = None
    if a.model is None:
        tmp = tempfile.TemporaryDirectory(prefix="ostinato-spec-")
        a.model = write_tiny_checkpoint(Path(tmp.name) / "tiny", "tiny", seed=0, progress=False)
    model = load_model(a.model, dtype=torch.float32, mtp=True)
    vocab = model.config.vocab_size
    prompt = [(7 * i + 3) % (vocab - 2) + 2 for i in range(a.prompt)]
    want, _ = _plain(model, prompt, a.tokens)
    at = len(prompt)
    rates = [float(r) for r in a.acceptance.split(",")]

    def forced(rate: float):
        reject_every = None if rate >= 1 else max(1, round(1 / (1 - rate)))  # 0.9: every 10th draft wrong
        count = [0]

        def draft(position, logits):
            count[0] += 1
            right = want[position - at] if position - at < len(want) else 0
            return (right + 1) % vocab if reject_every and count[0] % reject_every == 0 else right
        return draft

    seconds = {"plain": []} | {f"accept {r:g}": [] for r in rates}
    accepted, parts = {}, {"decode": [], "verify": [], "draft": []}
    for _ in range(a.rounds):  # every mode and the step parts once per round: the same machine load for all
        got, t = _plain(model, prompt, a.tokens)
        assert got == want
        seconds["plain"].append(t)
        for r in rates:
            got, t, spec = _speculative(model, prompt, a.tokens, forced(r))
            assert got == want, f"acceptance {r}: the tokens differ from plain decoding"
            seconds[f"accept {r:g}"].append(t)
            accepted[r] = spec.accepted / max(1, spec.drafted)
        for k, v in _step_costs(model, prompt, reps=8).items():
            parts[k] += v
    costs = {k: statistics.median(v) for k, v in parts.items()}
    gen = a.tokens - 1  # the first token comes from the prefill in every mode
    base = statistics.median(seconds["plain"])
    print(f"model {a.model.name}: prompt {a.prompt}, {a.tokens} tokens, {a.rounds} rounds, "
          f"{torch.get_num_threads()} threads")
    print("| mode | acceptance measured | tok/s | vs plain |\n|---|---|---|---|")
    for name, ts in seconds.items():
        med = statistics.median(ts)
        rate = "" if name == "plain" else f"{accepted[float(name.split()[1])]:.2f}"
        print(f"| {name} | {rate} | {gen / med:.1f} | {base / med:.2f}x |")
    print(f"per step (median): decode {costs['decode'] * 1e3:.2f} ms, verify of 2 tokens "
          f"{costs['verify'] * 1e3:.2f} ms ({costs['verify'] / costs['decode']:.2f}x), MTP draft "
          f"{costs['draft'] * 1e3:.2f} ms ({costs['draft'] / costs['decode']:.2f}x)")
    for r in rates:  # tokens per step and the step's cost from the parts: the model of the measurement
        step = costs["draft"] + costs["verify"] + (1 - r) * costs["decode"]
        print(f"expected at acceptance {r:g}: {(1 + r) / step:.1f} tok/s from the parts "
              f"((1 + a) / (draft + verify + (1 - a) x decode))")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
