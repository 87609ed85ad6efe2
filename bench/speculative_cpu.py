"""MTP speculative decoding on the CPU, measured side by side with plain decoding (issue #30).

    python -m ostinato.bench.speculative_cpu                       # the plain model, tiny preset (a temp dir)
    python -m ostinato.bench.speculative_cpu --model DIR --rounds 5
    python -m ostinato.bench.speculative_cpu --plan plans/x.yaml   # the engine as the plan places it

The same prompt and reply length run as plain greedy decoding and as speculative decoding with drafts
forced to a given acceptance (the known greedy continuation, replaced by a wrong token on a fixed
schedule), alternating in every round so every mode sees the same machine load; every mode's tokens are
checked equal to plain decoding's. Printed per mode: tok/s (median over rounds), the ratio to plain
decoding, and the per-step parts the ratio comes from (a one-token decode step, the two-token verify
step, the MTP draft) with the gain they imply. Two drivers (speculative_drivers.py): the plain float32
model (load_model, dense experts; runtime/model/speculative.py), or with --plan the engine (its placement,
fixed-shape steps, drafts and rollback; `--speculative off` and `mtp` engines side by side), whose plan's
own prediction for its hardware is printed too: that is not this machine, so compare the parts' ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from .speculative_drivers import EngineDriver, ModelDriver


def forced(want: list[int], vocab: int, rate: float):
    """draft(index in the reply) -> the right token, but a wrong one every 1/(1 - rate)-th draft."""
    reject_every = None if rate >= 1 else max(1, round(1 / (1 - rate)))  # 0.9: every 10th draft wrong
    count = [0]

    def draft(index: int) -> int:
        count[0] += 1
        right = want[index] if index < len(want) else 0
        return (right + 1) % vocab if reject_every and count[0] % reject_every == 0 else right
    return draft


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="a checkpoint with an MTP block (default: write the tiny preset)")
    src.add_argument("--plan", type=Path, help="measure the engine of this plan (its checkpoint needs the block)")
    p.add_argument("--prompt", type=int, default=200, help="prompt tokens (200)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per run (64)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every mode once (3)")
    p.add_argument("--acceptance", default="1.0,0.9,0.0", help="forced acceptance rates (1.0,0.9,0.0)")
    a = p.parse_args(argv)
    torch.set_grad_enabled(False)
    tmp = None
    if a.plan is not None:
        driver = EngineDriver(a.plan)
    else:
        if a.model is None:
            from ostinato.tiny import write_tiny_checkpoint

            tmp = tempfile.TemporaryDirectory(prefix="ostinato-spec-")
            a.model = write_tiny_checkpoint(Path(tmp.name) / "tiny", "tiny", seed=0, progress=False)
        driver = ModelDriver(a.model)
    vocab = driver.vocab
    prompt = [(7 * i + 3) % (vocab - 2) + 2 for i in range(a.prompt)]
    want, _ = driver.plain(prompt, a.tokens)
    rates = [float(r) for r in a.acceptance.split(",")]

    seconds = {"plain": []} | {f"accept {r:g}": [] for r in rates}
    accepted, parts = {}, {"decode": [], "verify": [], "draft": []}
    for _ in range(a.rounds):  # every mode and the step parts once per round: the same machine load for all
        got, t = driver.plain(prompt, a.tokens)
        assert got == want
        seconds["plain"].append(t)
        for r in rates:
            got, t, rate = driver.speculative(prompt, a.tokens, forced(want, vocab, r))
            assert got == want, f"acceptance {r}: the tokens differ from plain decoding"
            seconds[f"accept {r:g}"].append(t)
            accepted[r] = rate
        for k, v in driver.parts(prompt, reps=8).items():
            parts[k] += v
    costs = {k: statistics.median(v) for k, v in parts.items()}
    gen = a.tokens - 1  # the first token comes from the prefill in every mode
    base = statistics.median(seconds["plain"])
    print(f"{driver.describe()}: prompt {a.prompt}, {a.tokens} tokens, {a.rounds} rounds, "
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
        print(f"from the parts at acceptance {r:g}: {(1 + r) * costs['decode'] / step:.2f}x plain "
              f"((1 + a) x decode / (draft + verify + (1 - a) x decode))")
    print(driver.prediction())
    driver.close()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
