"""The side-by-side replay's bookkeeping (ostinato.bench.llama_cpp_side_by_side), with a scripted server in place
of llama-server / ostinato-serve: what each request carries, what counts as a wait, teacher forcing."""

from pathlib import Path

import pytest

from ostinato.bench import llama_cpp_side_by_side as sbs
from ostinato.workload import SessionShape, Turn


class Scripted:
    """Replies with `n` ids (prompt length + i), first token after 10 ms per 100 prompt tokens, then 1 ms each."""
    def __init__(self):
        self.prompts = []

    def generate(self, ids, n):
        self.prompts.append(list(ids))
        first = 0.01 * len(ids) / 100
        return [len(ids) + i for i in range(n)], first, first + 0.001 * (n - 1)


class Source:
    def __init__(self, start):
        self.next = start

    def take(self, n):
        import torch
        out = torch.arange(self.next, self.next + n)
        self.next += n
        return out


def test_replay_feeds_each_turn_the_conversation_with_its_own_replies():
    s = SessionShape("x/one", [Turn(100, 3), Turn(50, 2), Turn(150, 4)])
    server = Scripted()
    r = sbs.replay(server, [s], lambda i: Source(1000))
    p0, p1, p2 = server.prompts
    assert p0 == list(range(1000, 1100))
    assert p1 == p0 + [100, 101, 102] + list(range(1100, 1150))          # its reply, then the tool output
    assert p2 == p1 + [153, 154] + list(range(1150, 1300))
    assert r["waits"] == 2                                              # the first turn is no tool output
    assert r["median_wait_s"] == pytest.approx((0.01 * len(p1) / 100 + 0.01 * len(p2) / 100) / 2)
    assert r["replay_decode_tok_s"] == pytest.approx(6 / 0.006)          # 2 + 1 + 3 later tokens, 1 ms each


def test_top1_is_teacher_forced_one_token_per_prefix():
    server = Scripted()
    assert sbs.top1(server, list(range(10)), 7, eos=1) == [7, 8, 9]
    assert [len(p) for p in server.prompts] == [7, 8, 9]


def test_a_server_that_stops_at_the_end_of_sequence_picked_it():
    class StopsAtEight(Scripted):
        def generate(self, ids, n):  # as llama.cpp: the end of sequence ends the reply and is not returned
            out, first, last = super().generate(ids, n)
            return ([] if len(ids) == 8 else out), first, last
    assert sbs.top1(StopsAtEight(), list(range(10)), 7, eos=1) == [7, 1, 9]


def test_the_doc_block_is_replaced_between_markers():
    b, e = sbs.DOC_BEGIN.format("x"), sbs.DOC_END.format("x")
    other = f"{sbs.DOC_BEGIN.format('y')}\nkept\n{sbs.DOC_END.format('y')}"
    text = f"a\n{b}\nold\n{e}\n{other}"
    assert sbs.doc_with(text, "new", "x") == f"a\n{b}\n\nnew\n\n{e}\n{other}"
    with pytest.raises(SystemExit):
        sbs.doc_with(text, "new", "z")


def test_the_table_names_the_dense_format_a_run_chose():
    from argparse import Namespace
    chosen = Namespace(device_gib=8.0, dense_format="fp8", profile="synthetic:1.0")
    assert sbs._plan_label(chosen, "synthetic:1.0", "avx512_bf16") == \
        "cpu-only (avx512_bf16) with a 8 GiB device, dense matrices in fp8, profile synthetic:1.0"
    default = Namespace(device_gib=None, dense_format=None, profile="record")
    assert sbs._plan_label(default, "build/x/profile.safetensors", "avx2") == \
        "cpu-only (avx2), profile profile.safetensors"


def test_ours_is_planned_for_this_hosts_isa(tmp_path):
    import yaml
    spec = yaml.safe_load(Path(sbs._hardware(tmp_path, None, "avx512")).read_text())
    assert spec["host"]["isa"] == "avx512" and spec["gpus"]["usable_bytes"] == 4 * 2**30  # the preset's
    spec = yaml.safe_load(Path(sbs._hardware(tmp_path, 8.0, "avx2")).read_text())
    assert spec["host"]["isa"] == "avx2" and spec["gpus"]["usable_bytes"] == 8 * 2**30
