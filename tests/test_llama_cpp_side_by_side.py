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


def test_a_forced_isa_caps_the_engine_and_torch_and_says_so():
    """--isa avx2 on an AVX-512 CPU: Ostinato's environment caps its ISA and torch's (the host's own: nothing),
    llama.cpp builds haswell's ggml features without AVX-512, and the run's docs block and table name it."""
    from ostinato.bench import llama_cpp_build
    assert sbs.isa_env(None) == {}
    assert sbs.isa_env("avx2") == {"OSTINATO_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    flags = llama_cpp_build.ISA_FLAGS["avx2"]
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_AVX2=ON" in flags and "-DGGML_AVX512=OFF" in flags
    assert sbs.doc_label("v4-flash-4x32", None) == "v4-flash-4x32"
    assert sbs.doc_label("v4-flash-4x32", "avx2") == "v4-flash-4x32, avx2 code"
    run = {"prompt_tok_s": 10.0, "decode_tok_s": 2.0, "median_wait_s": 1.0, "p90_wait_s": 2.0,
           "replay_decode_tok_s": 2.0, "median_session_s": 3.0, "top1": [1, 2], "waits": 2}
    info = {"machine": "AMD EPYC", "threads": 1, "checkpoint": "c", "llama": "l", "gguf": "g", "llama_flags": "-t 1",
            "dtype": "bfloat16", "plan": "p", "sessions": "s", "prompt": 8, "generate": 4}
    plain = sbs.table({sbs.LLAMA: run, sbs.OURS: run}, info)
    forced = sbs.table({sbs.LLAMA: run, sbs.OURS: run}, dict(info, forced_isa="avx2", native_isa="avx512_bf16"))
    assert "avx2" not in plain
    assert "avx2 code on both sides" in forced and "not an avx2 machine" in forced and "OSTINATO_ISA=avx2" in forced
    assert "Load average 1.50 at the start, 2.25 at the end" in sbs.table({sbs.LLAMA: run, sbs.OURS: run},
                                                                          dict(info, load=(1.5, 2.25)))


def test_a_forced_isa_llama_cpp_builds_into_its_own_folder(tmp_path, monkeypatch):
    """A build for another ISA never reuses (or replaces) the host's build, and an ISA without flags is refused."""
    from ostinato.bench import llama_cpp_build
    for name in ("build", "build-avx2"):
        (tmp_path / name / "bin").mkdir(parents=True)
        (tmp_path / name / "bin" / llama_cpp_build.SERVER_TARGET).write_text("")
    monkeypatch.setattr(llama_cpp_build, "_installed_server", lambda: None)
    assert llama_cpp_build.find_or_build_server(tmp_path, tmp_path).parent.parent.name == "build"
    assert llama_cpp_build.find_or_build_server(tmp_path, tmp_path, isa="avx2").parent.parent.name == "build-avx2"
    with pytest.raises(SystemExit, match="amx"):
        llama_cpp_build.find_or_build_server(tmp_path, tmp_path, isa="amx")


def test_the_warm_up_reaches_past_every_context_the_run_reaches():
    """Each server is warmed at doubling lengths up to the longest context measured (the bench prompt with its
    tokens, or a replayed conversation), so no one-time setup at a new length lands in a measured request."""
    s = SessionShape("x/one", [Turn(100, 3), Turn(50, 2), Turn(1500, 4)])  # 1,659 tokens by its last turn
    assert sbs.warm_lengths([s], 300) == [64, 128, 256, 512, 1024, 2048]
    assert sbs.warm_lengths([s], 3000) == [64, 128, 256, 512, 1024, 2048, 4096]
    assert sbs.warm_lengths([SessionShape("x/two", [Turn(10, 2)])], 40) == [64]
    assert sbs.warm_lengths([s], 3000, limit=2000) == [64, 128, 256, 512, 1024, 2000]  # within the context
