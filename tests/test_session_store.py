"""Sessions that survive a restart (--session-dir): the file format alone, the store alone, then the
real server stopped and started again on the same folder, driven by the official openai client."""

from __future__ import annotations

import logging
import time

import httpx
import openai
import pytest
import torch
from conftest import assert_close_to_scale, compile_tiny_plan
from tokenizers import Tokenizer

from ostinato.runtime.engine.loader import load_engine
from ostinato.runtime.model.session_file import SessionFileError, read_header, read_session, write_session
from ostinato.server.app import create_app
from ostinato.server.background import serve_in_background
from ostinato.server.chat_encoding import ChatOptions, encode, render
from ostinato.server.session_store import SUFFIX, SessionStore, engine_identity, file_name

pytestmark = pytest.mark.slow  # a compiled plan's engine (C++ kernels) and a server

IDENTITY = {"model": "m" * 64, "plan": "p" * 64, "dtype": "float32"}
LONG = " ".join(f"item {i} costs {i * 7 % 100} coins;" for i in range(120))  # about 2,000 tokens
STORE_LOG = "ostinato.server.session_store"


@pytest.fixture(scope="module")
def plan(tiny_ckpt, tmp_path_factory, kernel_dir):
    work = tmp_path_factory.mktemp("session_store")
    compile_tiny_plan(tiny_ckpt, work, kernel_dir, context=4096)
    return work / "plan.yaml"


@pytest.fixture(scope="module")
def engine(plan, tiny_ckpt):
    return load_engine(plan, tiny_ckpt, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def tok(tiny_ckpt):
    return Tokenizer.from_file(str(tiny_ckpt / "tokenizer.json"))


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 1000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _session(engine, turns: list[int], decoded: int, seed: int = 0):
    """An engine session of len(turns) prefill calls (turn boundaries: snapshots), then `decoded` decode steps."""
    session, ids = engine.new_session(), _ids(sum(turns) + decoded, seed)
    start = 0
    for n in turns:
        session.prefill(ids[start:start + n])
        start += n
    for t in ids[start:]:
        session.decode(t)
    return session


def _save(store, session) -> bool:
    return store.save(session.state().tokens, session.state())


# ----- the file ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_file_round_trip_continues_exactly(engine, plan, tiny_ckpt, tmp_path, dtype):
    if dtype == "bfloat16":
        engine = load_engine(plan, tiny_ckpt, device="cpu", dtype=torch.bfloat16)
    identity = {**IDENTITY, "dtype": dtype}
    a = _session(engine, [80, 20], decoded=3)
    path = tmp_path / "s.session.safetensors"
    write_session(path, a.state(), identity)
    assert read_header(path)["tokens"] == a.state().tokens and not list(tmp_path.glob(".*tmp*"))  # no temp left
    b = engine.new_session()
    b.adopt(read_session(path, engine.model, identity))
    assert b.state().tokens == a.state().tokens and [s.position for s in b.state().snapshots] == [80, 100, 103]
    assert torch.equal(b.decode(9), a.decode(9))
    a.truncate(90)  # back inside the second turn: restores the snapshot at 80 in both
    b.truncate(90)
    assert torch.equal(b.prefill([1, 2, 3]), a.prefill([1, 2, 3]))
    with pytest.raises(SessionFileError, match="another dtype"):
        read_session(path, engine.model, {**identity, "dtype": "float32" if dtype == "bfloat16" else "bfloat16"})


# ----- the store ---------------------------------------------------------------------------------
def test_store_matches_like_the_prefix_cache_and_drops_redundant_files(engine, tmp_path):
    store = SessionStore(tmp_path, IDENTITY)
    s = _session(engine, [100], decoded=0, seed=1)
    tokens = list(s.state().tokens)
    assert _save(store, s)
    longer = s.fork()
    longer.prefill(_ids(20, 2))
    assert _save(store, longer)
    held = longer.state().tokens
    assert len(store) == 1 and (tmp_path / file_name(held)).exists()  # the 100-token file was a prefix of it
    name, n = store.match(held + [5])
    assert name == file_name(held) and n == 120
    assert store.match(held)[1] == 119  # the last prompt token is always prefilled
    assert store.match(tokens[:50] + [2] * 60)[0] is None  # 50 of 120: less than half, not worth it
    assert store.match(tokens[:70] + [2] * 60)[1] == 70
    reopened = SessionStore(tmp_path, IDENTITY)  # the index comes back from the headers
    assert list(reopened.files) == list(store.files) and reopened.load(name, engine.model).tokens == held


def test_byte_bound_deletes_the_least_recently_used(engine, tmp_path):
    sessions = [_session(engine, [100], decoded=0, seed=10 + i) for i in range(4)]
    size = write_session(tmp_path / "probe", sessions[0].state(), IDENTITY)
    (tmp_path / "probe").unlink()
    store = SessionStore(tmp_path, IDENTITY, max_bytes=int(2.5 * size))
    a, b, c, d = (file_name(s.state().tokens) for s in sessions)
    _save(store, sessions[0])
    _save(store, sessions[1])
    assert store.load(a, engine.model) is not None  # a is used: b is now the least recently used
    _save(store, sessions[2])
    assert sorted(store.files) == sorted([a, c]) and not (tmp_path / b).exists() and store.stats.deleted == 1
    reopened = SessionStore(tmp_path, IDENTITY, max_bytes=int(2.5 * size))  # the order survives: file mtimes
    _save(reopened, sessions[3])
    assert sorted(reopened.files) == sorted([c, d]) and reopened.bytes <= int(2.5 * size)


# ----- the session behind the server -------------------------------------------------------------
def test_loaded_session_equals_the_original_and_a_fresh_prefill(engine, tmp_path):
    ids = _ids(2001, 3)
    original = engine.new_session()
    original.prefill(ids[:1500])
    original.prefill(ids[1500:1996], last_only=True)
    for t in ids[1996:2000]:
        original.decode(t)
    store = SessionStore(tmp_path, engine_identity(engine))
    start = time.perf_counter()
    store.save(original.state().tokens, original.state())
    saved_s = time.perf_counter() - start
    start = time.perf_counter()
    loaded = engine.new_session()
    loaded.adopt(store.load(file_name(ids[:2000]), engine.model))
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    fresh = engine.new_session().prefill(ids, last_only=True)[-1]
    prefill_s = time.perf_counter() - start
    ours = loaded.prefill(ids[2000:], last_only=True)[-1]
    assert torch.equal(ours, original.prefill(ids[2000:], last_only=True)[-1])  # the same state, bit for bit
    assert_close_to_scale(ours, fresh, 1e-5, "next-token logits after a load vs a fresh prefill")
    assert torch.equal(loaded.decode(17), original.decode(17))
    print(f"\n2,000-token session: {store.bytes} bytes, save {saved_s:.3f} s, load {load_s:.3f} s; "
          f"fresh prefill of 2,001 tokens {prefill_s:.3f} s")


# ----- the server --------------------------------------------------------------------------------
class Force:
    """A logits hook that makes the reply `tokens` then EOS (a reply that re-renders to the same ids)."""

    def __init__(self, eos: int):
        self.eos, self.tokens = eos, None

    def __call__(self, gen, logits):
        if self.tokens is None:
            return logits
        out = torch.full_like(logits, float("-inf"))
        out[self.tokens[len(gen)] if len(gen) < len(self.tokens) else self.eos] = 0.0
        return out


def _serve(engine, tok, store, **kw):
    app = create_app(engine, tok, "tiny", session_store=store, **kw)
    srv, base = serve_in_background(app)
    return srv, app, openai.OpenAI(base_url=base, api_key="none", max_retries=0)


def _stop(srv, app) -> None:
    """Stop uvicorn; its shutdown stops the worker, which writes what the store lacks first."""
    srv.should_exit = True
    app.state.server.worker.thread.join(timeout=60)
    assert not app.state.server.worker.thread.is_alive()


def _chat(client, msgs, max_tokens):
    return client.chat.completions.create(model="tiny", messages=msgs, max_tokens=max_tokens)


def test_restarted_server_reuses_the_stored_conversation(plan, tiny_ckpt, engine, tok, tmp_path):
    folder = tmp_path / "sessions"
    force = Force(engine.model.config.eos_token_id)
    force.tokens = tok.encode("Sure.", add_special_tokens=False).ids
    first = [{"role": "user", "content": LONG}]
    prompt = encode(tok, render(first, [], ChatOptions(False, None)))
    assert 1800 <= len(prompt) <= 2200
    srv, app, client = _serve(engine, tok, SessionStore(folder, engine_identity(engine), idle_s=0.2),
                              logits_hook=force)
    r1 = _chat(client, first, 8)
    assert r1.choices[0].message.content == "Sure." and r1.choices[0].finish_reason == "stop"
    deadline = time.time() + 30  # written after 0.2 s without a request, while the server runs
    while not list(folder.glob("*.safetensors")) and time.time() < deadline:
        time.sleep(0.05)
    _stop(srv, app)
    [stored] = list(folder.glob("*" + SUFFIX))  # and its prompt's end logits beside it
    held = read_header(stored)["tokens"]
    assert held == prompt + force.tokens  # the prompt and the reply (its EOS was never fed back)

    restarted = load_engine(plan, tiny_ckpt, device="cpu", dtype=torch.float32)  # a new process, as far as it goes
    store = SessionStore(folder, engine_identity(restarted))
    assert len(store) == 1
    srv, app, client = _serve(restarted, tok, store)
    second = first + [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": "And then?"}]
    r2 = _chat(client, second, 6)
    assert r2.usage.prompt_tokens_details.cached_tokens == len(held)
    assert app.state.server.cache.stats.loaded == 1
    metrics = httpx.get(str(client.base_url).removesuffix("/v1/") + "/metrics").text
    assert "ostinato_session_files_loaded_total 1" in metrics.splitlines()
    _stop(srv, app)

    srv, app, client = _serve(restarted, tok, None)  # the reference: no store, the whole prompt prefilled
    ref = _chat(client, second, 6)
    _stop(srv, app)
    assert ref.usage.prompt_tokens_details.cached_tokens == 0
    assert r2.choices[0].message.content == ref.choices[0].message.content
    assert r2.usage.completion_tokens == ref.usage.completion_tokens


def test_bad_files_are_refused_by_name_and_the_prompt_recomputed(engine, tok, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=STORE_LOG)
    ids = encode(tok, render([{"role": "user", "content": LONG[:600]}], [], ChatOptions(False, None)))
    identity, session = engine_identity(engine), engine.new_session()
    session.prefill(ids[:-1])
    names = {}
    for kind, cut, ident in (("flipped", 1, identity), ("truncated", 2, identity),
                             ("foreign", 3, {**identity, "model": "0" * 64})):
        session.truncate(len(ids) - cut)
        names[kind] = file_name(session.state().tokens)
        write_session(tmp_path / names[kind], session.state(), ident)
    data = bytearray((tmp_path / names["flipped"]).read_bytes())
    data[-5] ^= 0x40  # a flipped bit in a tensor: the header still reads well
    (tmp_path / names["flipped"]).write_bytes(data)
    truncated = tmp_path / names["truncated"]
    truncated.write_bytes(truncated.read_bytes()[:-1000])

    store = SessionStore(tmp_path, identity, idle_s=60)
    assert list(store.files) == [names["flipped"]]  # the scan refused two by their headers
    srv, app, client = _serve(engine, tok, store, cache_sessions=1)
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=4, extra_body={"return_token_ids": True})
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # nothing reused: the prompt was recomputed
    fresh = engine.new_session()
    want = [int(fresh.prefill(ids, last_only=True)[-1].argmax())]
    for _ in range(3):
        want.append(int(fresh.decode(want[-1]).argmax()))
    assert r.choices[0].model_extra["token_ids"] == want
    other = client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=1)  # evicts the first
    deadline = time.time() + 30  # written once the reply is out, not after idle_s
    while not store.files and time.time() < deadline:
        time.sleep(0.05)
    assert other.usage.completion_tokens == 1 and len(store) == 1
    _stop(srv, app)

    refused = {kind: [r for r in caplog.records if r.name == STORE_LOG and name in r.getMessage()]
               for kind, name in names.items()}
    assert all(len(v) == 1 and v[0].levelno == logging.WARNING for v in refused.values()), refused
    assert "corrupt" in refused["flipped"][0].getMessage()
    assert "truncated" in refused["truncated"][0].getMessage()
    assert "another model" in refused["foreign"][0].getMessage()
    # refused/ names each file by its identity's tag: the same tokens from two models do not collide
    assert sorted(p.name.split("-", 1)[1] for p in (tmp_path / "refused").iterdir()) == sorted(names.values())
    assert len(SessionStore(tmp_path, identity)) == 2  # the two sessions served, written at eviction and stop
    assert not set(names.values()) & {p.name for p in tmp_path.iterdir()}
