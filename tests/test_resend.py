"""A prompt sent again whole after a restart (issue #52): the session on disk holds it and its reply, and
the logits kept beside it give the reply's first token, so nothing is computed again and the reply is
the one the first server gave."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from conftest import compile_tiny_plan
from test_session_store import _serve, _stop
from tokenizers import Tokenizer

from ostinato.runtime.engine.loader import load_engine
from ostinato.server.session_store import SUFFIX, SessionStore, engine_identity, file_name, logits_name

pytestmark = pytest.mark.slow  # a compiled plan's engine (C++ kernels) behind the server

TEXT = " ".join(f"step {i}: move box {i % 7} to shelf {i * 3 % 11}." for i in range(30))  # ~400 tokens


@pytest.fixture(scope="module")
def engine(tiny_ckpt, tmp_path_factory, kernel_dir):
    work = tmp_path_factory.mktemp("resend")
    compile_tiny_plan(tiny_ckpt, work, kernel_dir, context=1024)
    return load_engine(work / "plan.yaml", tiny_ckpt, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def tok(tiny_ckpt):
    return Tokenizer.from_file(str(tiny_ckpt / "tokenizer.json"))




def _ask(client, messages):
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)


def test_an_identical_resend_after_a_restart_is_served_from_disk(engine, tok, tmp_path):
    folder, messages = tmp_path / "sessions", [{"role": "user", "content": TEXT}]
    srv, app, client = _serve(engine, tok, SessionStore(folder, engine_identity(engine)))
    first = _ask(client, messages)
    _stop(srv, app)  # writes the session (prompt + reply) and the logits after the prompt
    assert first.usage.prompt_tokens_details.cached_tokens == 0 and first.usage.prompt_tokens > 300

    store = SessionStore(folder, engine_identity(engine))  # a restart: the cache rebuilt from the folder
    [stored] = list(store.files.values())
    assert stored.logits_at == first.usage.prompt_tokens
    srv, app, client = _serve(engine, tok, store)
    again = _ask(client, messages)
    _stop(srv, app)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens == first.usage.prompt_tokens
    assert app.state.server.cache.stats.loaded == 1
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.completion_tokens == first.usage.completion_tokens


def test_logits_that_fail_their_hash_are_deleted_and_the_last_token_computed(engine, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="ostinato.server.session_store")
    ids = torch.randint(3, 1000, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    session = engine.new_session()
    logits = session.prefill(ids, last_only=True)[-1]
    for t in (7, 8, 9):
        session.decode(t)
    store = SessionStore(tmp_path, engine_identity(engine))
    assert store.save(session.state().tokens, session.state(), (len(ids), logits))
    name = file_name(ids + [7, 8, 9])
    assert store.match(ids) == (name, len(ids)) and torch.equal(store.end_logits(name, len(ids)), logits)
    assert store.match(ids + [5]) == (name, len(ids))  # a longer prompt: as before, the file's common prefix

    path = tmp_path / logits_name(name)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # a flipped bit in the logits: the header still reads well
    path.write_bytes(data)
    time.sleep(0.01)
    reopened = SessionStore(tmp_path, engine_identity(engine))
    assert reopened.match(ids) == (name, len(ids))        # the header promises them
    assert reopened.end_logits(name, len(ids)) is None    # the contents do not hold that promise
    assert not path.exists() and reopened.match(ids) == (name, len(ids) - 1)  # as a file without logits
    assert [r for r in caplog.records if "corrupt" in r.getMessage() and logits_name(name) in r.getMessage()]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert name.endswith(SUFFIX)
