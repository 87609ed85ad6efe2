"""The weights are part of a model's identity (issue #29): a checkpoint with the same config and index and
other tensor bytes (a re-quantization, an update, a fine-tune) is refused by a plan compiled for the
original, naming the shard, and never reuses a session file saved from it. Shard digests are computed
once (cached by path and stat) and a read-only checkpoint, or no writable cache at all, still works."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ostinato.checkpoint import weight_fingerprint as wf
from ostinato.checkpoint.weight_fingerprint import shard_files, weight_fingerprint
from ostinato.compiler.cli import compile as compile_cli
from ostinato.compiler.compile import CompileOptions, compile_plan
from ostinato.plan import PlanError, load_plan
from ostinato.runtime import load_model
from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.model.session_file import write_session
from ostinato.server.session_store import REFUSED_KEPT, SessionStore, engine_identity, file_name, identity_tag

REPO = Path(__file__).resolve().parents[1]
SHARD = "model-00002-of-00007.safetensors"  # layer 0 (embed, 4 layers, head, MTP)
OLD = 1_600_000_000_000_000_000  # an mtime long past: entries for the copies may be remembered


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Each test's own digest cache (not ~/.cache)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("OSTINATO_CACHE_DIR", str(folder))
    return folder


def _copy(ckpt: Path, where: Path) -> Path:
    """A copy of the checkpoint whose files look old (their digests are remembered)."""
    shutil.copytree(ckpt, where)
    for f in where.iterdir():
        os.utime(f, ns=(OLD, OLD))
    return where


def _flip(shard: Path) -> None:
    """Flip one bit of the last tensor's data: the same size, the same header, other weights."""
    data = bytearray(shard.read_bytes())
    header_end = 8 + int.from_bytes(data[:8], "little")
    assert len(data) > header_end
    data[-1] ^= 0x01
    shard.write_bytes(data)


def test_fingerprint_follows_every_shard_byte_and_names_the_shard(tiny_ckpt, tmp_path):
    ckpt = _copy(tiny_ckpt, tmp_path / "ckpt")
    before = weight_fingerprint(ckpt)
    assert sorted(before.shards) == shard_files(ckpt) and len(before.shards) == 7
    assert before.shards[SHARD] == hashlib.sha256((ckpt / SHARD).read_bytes()).hexdigest()
    size = (ckpt / SHARD).stat().st_size
    _flip(ckpt / SHARD)
    after = weight_fingerprint(ckpt)
    assert (ckpt / SHARD).stat().st_size == size
    assert [n for n in before.shards if before.shards[n] != after.shards[n]] == [SHARD]
    assert before.combined != after.combined


def test_no_weights_no_fingerprint(tmp_path):
    """plans/models/deepseek-v4-flash holds config.json alone: null, like index_sha256."""
    assert weight_fingerprint(REPO / "plans/models/deepseek-v4-flash") is None
    plan = compile_plan(CompileOptions(REPO / "plans/models/deepseek-v4-flash", tmp_path / "p.yaml",
                                       "rtx4090d-x4", profile="synthetic:0.9", build_kernels=False)).plan
    assert plan.provenance.weights_sha256 is None and plan.provenance.shard_sha256 == {}
    assert plan.provenance.index_sha256 is None


def test_plan_refuses_weights_changed_after_compile(tiny_ckpt, tmp_path):
    ckpt = _copy(tiny_ckpt, tmp_path / "ckpt")
    out = tmp_path / "plan.yaml"
    assert compile_cli.main([str(ckpt), str(out), "--hardware", "cpu-only", "--no-kernels"]) == 0
    plan = load_plan(out)
    assert plan.provenance.shard_sha256 == weight_fingerprint(ckpt).shards
    assert plan.provenance.weights_sha256 == weight_fingerprint(ckpt).combined
    _flip(ckpt / SHARD)
    with pytest.raises(PlanError, match=rf"shard '{SHARD}' has sha256 [0-9a-f]{{64}}, the plan was compiled for"):
        load_engine(out, ckpt, device="cpu", dtype=torch.float32)


def _engine(ckpt: Path) -> SimpleNamespace:
    """What engine_identity reads of an engine: the same plan and dtype, the checkpoint's folder."""
    return SimpleNamespace(model_dir=ckpt, plan=SimpleNamespace(sha256="p" * 64),
                           model=SimpleNamespace(dtype=torch.float32))


def test_session_file_from_other_weights_is_refused_and_kept(tiny_ckpt, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="ostinato.server.session_store")
    ckpt, store_dir = _copy(tiny_ckpt, tmp_path / "ckpt"), tmp_path / "sessions"
    store_dir.mkdir()
    original = engine_identity(_engine(ckpt))
    session = load_model(ckpt, dtype=torch.float32).new_session()
    session.prefill([5, 6, 7, 8, 9])
    name = file_name(session.tokens)
    write_session(store_dir / name, session, original)
    assert len(SessionStore(store_dir, original)) == 1  # the original weights reuse it

    _flip(ckpt / SHARD)
    modified = engine_identity(_engine(ckpt))
    assert modified["model"] == original["model"] and modified["weights"] != original["weights"]
    store = SessionStore(store_dir, modified)
    assert len(store) == 0 and store.stats.refused == 1
    message = next(r.getMessage() for r in caplog.records if name in r.getMessage())
    assert "computed with other weights" in message
    kept = store_dir / "refused" / f"{identity_tag(original)}-{name}"
    assert kept.is_file()

    # a later run refusing more files than refused/ keeps, of another kind, does not push it out
    for i in range(REFUSED_KEPT + 2):
        (store_dir / f"{i:032x}.session.safetensors").write_bytes(b"not a session")
    SessionStore(store_dir, modified)
    assert kept.is_file()
    assert len(list((store_dir / "refused").glob("unreadable-*"))) == REFUSED_KEPT


def test_second_fingerprint_hits_the_cache(tiny_ckpt, tmp_path, monkeypatch, cache):
    ckpt = _copy(tiny_ckpt, tmp_path / "ckpt")
    hashed = []
    real = wf.hash_file
    monkeypatch.setattr(wf, "hash_file", lambda path, *a: hashed.append(path.name) or real(path, *a))
    first = weight_fingerprint(ckpt)
    assert sorted(hashed) == shard_files(ckpt) and len(list(cache.rglob("*.json"))) == 7
    hashed.clear()
    assert weight_fingerprint(ckpt) == first and hashed == []  # a stat per shard, no read
    _flip(ckpt / SHARD)
    os.utime(ckpt / SHARD, ns=(OLD + 1, OLD + 1))  # even with an old mtime: its ctime moved
    weight_fingerprint(ckpt)
    assert hashed == [SHARD]


def test_read_only_checkpoint_and_no_writable_cache(tiny_ckpt, tmp_path, monkeypatch):
    ckpt = _copy(tiny_ckpt, tmp_path / "ckpt")
    expected = {f: hashlib.sha256((ckpt / f).read_bytes()).hexdigest() for f in shard_files(ckpt)}
    blocker = tmp_path / "a-file"  # nothing can be made under a file, not even by root
    blocker.write_text("")
    for var in ("OSTINATO_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.setenv(var, str(blocker / var.lower()))
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(blocker / "tmp"))
    for f in ckpt.iterdir():
        f.chmod(0o444)
    ckpt.chmod(0o555)
    try:
        before = sorted(p.name for p in ckpt.iterdir())
        assert weight_fingerprint(ckpt).shards == expected
        assert weight_fingerprint(ckpt).shards == expected  # hashed again (nothing remembered), still right
        assert sorted(p.name for p in ckpt.iterdir()) == before  # nothing written beside the weights
    finally:
        ckpt.chmod(0o755)
