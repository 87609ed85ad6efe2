"""Torch ops per layer that a plan's engine dispatches on the CPU: split-route prefills of 1, 16 and 128
tokens after a 300-token context (tool outputs), a decode step, and a fixed-shape 2-token step when the plan
has one (a bucket, or the speculative verify). These are the figures behind the cost model's
EAGER_OPS_PER_LAYER and EAGER_STEP_OPS_PER_LAYER (compiler/cost_model/forward.py); `--sources` adds where the ops
come from. Plain decoding (speculation off): the decode step as every plan runs it.

Usage: python -m ostinato.bench.count_ops PLAN [--sources] [--top N]
Last line: `ops_per_layer prefill1=A prefill16=B prefill128=C decode=D [step2=S]`.
"""

from __future__ import annotations

import argparse

from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.engine.op_count import ops_per_layer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plan")
    p.add_argument("--sources", action="store_true", help="ops per layer by the runtime function that issued them")
    p.add_argument("--top", type=int, default=12, help="rows of the --sources table (default 12)")
    a = p.parse_args()
    engine = load_engine(a.plan, device="cpu", speculative="off", cpu_step="eager")  # the eager step's ops
    try:
        counts = ops_per_layer(engine, sources=a.sources)
    finally:
        engine.close()
    layers = engine.plan.model.layers
    for name, (per_layer, counter) in counts.items():
        print(f"{name:>12}: {per_layer:6.1f} ops per layer")
        for source, n in counter.by_source.most_common(a.top):
            print(f"{'':14}{n / layers:6.1f}  {source}")
    print("ops_per_layer " + " ".join(f"{k.replace(' ', '')}={v:.1f}" for k, (v, _) in counts.items()))


if __name__ == "__main__":
    main()
