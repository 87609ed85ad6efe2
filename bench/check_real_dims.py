"""Exactness at DeepSeek-V4-Flash's real dimensions: our forward against transformers', one run.

    python -m ostinato.bench.check_real_dims [--layers 4] [--experts 16] [--prompt 2600] [--decode 4] [--work DIR]

A V4-Flash slice (`ostinato-make-tiny --preset flash`, default 4 layers: sliding, sliding, CSA, HCA,
with 16 experts so transformers fits in float32 beside it) gets a 2,600-token prompt: the CSA layer
has 650 compressed rows and index_topk 512, so the indexer really selects. Ours prefills it in two
chunks and decodes greedily; transformers' DeepseekV4ForCausalLM (float32, the reference) runs the
whole sequence in one forward. Each side runs in its own process (each holds ~10 GB here) and ours
hands its logits over through a file. Reported: max |diff| over all positions relative to the logit
scale (the project's bound is 1e-4) and whether the argmax agrees at every position.

Where the indexer's k-th and (k+1)-th scores tie exactly, the two may keep different rows (ours
keeps the earlier entry, transformers' torch.topk leaves it unspecified); the tool counts such
positions so a difference can be told apart from an error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def ours(ckpt: str, prompt: int, decode: int, out: str) -> None:
    from ostinato.runtime import load_model

    model = load_model(ckpt, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0))
    session = model.new_session()
    t0 = time.perf_counter()
    half = prompt // 2
    logits = [session.prefill(ids[:half]), session.prefill(ids[half:])]  # two chunks, the cache between
    tokens = ids.tolist()
    for _ in range(decode):
        nxt = int(logits[-1][-1].argmax())
        tokens.append(nxt)
        logits.append(session.decode(nxt)[None])
    seconds = time.perf_counter() - t0
    torch.save({"tokens": torch.tensor(tokens), "logits": torch.cat(logits)[:-1], "seconds": seconds}, out)


def reference(ckpt: str, ours_file: str) -> dict:
    from transformers import AutoModelForCausalLM

    got = torch.load(ours_file)
    tokens, mine = got["tokens"], got["logits"]  # mine [N-1 + 1, V]: logits after every token but the last
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    model.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        ref = model(tokens[None, :-1]).logits[0]  # [N-1, V]
    seconds = time.perf_counter() - t0
    scale = ref.abs().max().item()
    diff = (mine - ref).abs().amax(dim=-1)  # [N-1]
    same = mine.argmax(-1) == ref.argmax(-1)
    return dict(positions=int(ref.shape[0]), max_rel_diff=diff.max().item() / scale, logit_scale=scale,
                worst_position=int(diff.argmax()), argmax_agree=int(same.sum()),
                first_disagreement=(int((~same).nonzero()[0]) if not same.all() else None),
                ours_s=got["seconds"], transformers_s=seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=2600)
    ap.add_argument("--decode", type=int, default=4)
    ap.add_argument("--work", default=str(REPO / "build" / "real-dims"))
    ap.add_argument("--ours", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--reference", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ours:
        ours(a.ours[0], int(a.ours[1]), int(a.ours[2]), a.ours[3])
        return 0
    if a.reference:
        print(json.dumps(reference(*a.reference)))
        return 0
    work = Path(a.work)
    ckpt = work / f"flash-{a.layers}x{a.experts}"
    if not (ckpt / "config.json").exists():
        subprocess.run([sys.executable, "-m", "ostinato.cli.make_tiny", str(ckpt), "--preset", "flash", "--layers",
                        str(a.layers), "--experts", str(a.experts), "--force", "--quiet"], check=True)
    logits = work / "ours.pt"
    subprocess.run([sys.executable, __file__, "--ours", str(ckpt), str(a.prompt), str(a.decode), str(logits)],
                   check=True)
    r = subprocess.run([sys.executable, __file__, "--reference", str(ckpt), str(logits)], check=True,
                       capture_output=True, text=True)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    logits.unlink()
    ok = res["max_rel_diff"] <= 1e-4 and res["first_disagreement"] is None
    print(f"V4-Flash slice {a.layers} layers x {a.experts} experts, {a.prompt}-token prompt in two chunks + "
          f"{a.decode} decode steps, float32:")
    print(f"  max |ours - transformers| = {res['max_rel_diff']:.2e} of the logit scale ({res['logit_scale']:.3g}), "
          f"worst at position {res['worst_position']}")
    print(f"  argmax agrees at {res['argmax_agree']} of {res['positions']} positions")
    print(f"  time: ours {res['ours_s']:.0f} s, transformers {res['transformers_s']:.0f} s "
          f"({res['ours_s'] / res['transformers_s']:.2f}x)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
