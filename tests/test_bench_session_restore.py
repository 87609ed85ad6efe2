"""bench/session_restore.py: its non-timing parts (the conversation it stores, its table, its block in
docs/benchmarks.md) fast; one short end-to-end run on a compiled tiny plan (slow). No test times anything."""

from __future__ import annotations

import pytest

from ostinato.bench import session_restore as sr


def _result() -> sr.Result:
    r = sr.Result("plans/tiny.cpu-only.yaml", tokens=120_000, append=300, turn=8192, file_bytes=62_500_000,
                  logits_max_diff=3e-6)
    for restore_s, recompute_s in ((1.5, 300.0), (2.5, 320.0), (2.0, 310.0)):
        r.timings.append(sr.Timing("restore", restore_s, 300, 7, 2.0, 3.0))
        r.timings.append(sr.Timing("recompute", recompute_s, 120_300, 7, 4.0, 5.0))
    return r


def test_conversation_and_turns():
    prefix, new = sr.conversation(1000, 30, vocab=1024, seed=0)
    assert len(prefix) == 1000 and len(new) == 30 and min(prefix + new) >= 3 and max(prefix + new) < 1024
    assert sr.conversation(1000, 30, 1024, 0) == (prefix, new) and sr.conversation(1000, 30, 1024, 1)[0] != prefix
    assert sr.turn_sizes(20_000, 8192) == [8192, 8192, 3616] and sr.turn_sizes(8192, 8192) == [8192]
    with pytest.raises(ValueError, match="--turn-tokens"):
        sr.turn_sizes(100, 0)


def test_table_gives_medians_rounds_bytes_and_loads():
    r = _result()
    assert r.median("restore") == 2.0 and r.median("recompute") == 310.0
    text = sr.table(r, "2 CPU threads")
    assert "| median s | 2.00 | 310.00 |" in text
    assert "| each round s | 1.50 / 2.50 / 2.00 | 300.00 / 320.00 / 310.00 |" in text
    assert "| tokens computed | 300 | 120,300 |" in text and "62.5 MB" in text
    assert "| 1-min load average, median (range) | 2.5 (2.0-3.0) | 4.5 (4.0-5.0) |" in text
    assert "155.0x faster" in text and "3 rounds" in text


def test_doc_block_is_added_once_then_replaced():
    doc = "# Benchmarks\n\nsomething measured\n"
    once = sr.doc_with(doc, "first table")
    assert once.startswith(doc.rstrip("\n")) and once.count(sr.DOC_BEGIN) == 1 and sr.DOC_HEADING in once
    twice = sr.doc_with(once + "\nlater text\n", "second table")
    assert "first table" not in twice and "second table" in twice and twice.count(sr.DOC_BEGIN) == 1
    assert twice.endswith("later text\n") and twice.count(sr.DOC_HEADING) == 1
    with pytest.raises(ValueError, match="broken"):
        sr.doc_with(doc + sr.DOC_END + "\n", "x")


def test_page_cache_advice_leaves_the_file(tmp_path):
    f = tmp_path / "s.session.safetensors"
    f.write_bytes(b"x" * 4096)
    sr.drop_from_page_cache([f])
    assert f.read_bytes() == b"x" * 4096


@pytest.mark.slow  # compiles a plan (C++ kernels) and runs a short conversation both ways
def test_a_short_run_restores_and_recomputes_the_same_first_token(tiny_ckpt, tmp_path, kernel_dir, monkeypatch):
    from conftest import compile_tiny_plan

    compile_tiny_plan(tiny_ckpt, tmp_path, kernel_dir, max_hot_per_layer=4)
    out, store = tmp_path / "table.md", tmp_path / "sessions"
    assert sr.main(["--plan", str(tmp_path / "plan.yaml"), "--tokens", "700", "--append", "20", "--turn-tokens",
                    "256", "--rounds", "2", "--session-dir", str(store), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| tokens computed | 20 | 720 |" in text and "2 rounds" in text
    assert len(list(store.glob("*.session.safetensors"))) == 1  # the stored conversation, kept where asked
    with pytest.raises(SystemExit):  # a folder with sessions in it already is refused
        sr.main(["--plan", str(tmp_path / "plan.yaml"), "--session-dir", str(store)])
