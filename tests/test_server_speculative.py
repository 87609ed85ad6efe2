"""The server decoding with MTP speculation (issue #30): greedy replies equal plain decoding's over two
turns of one cached session, drafts the model agrees with are kept, a seeded sampled reply is plain
sampling's own, /metrics counts drafts; and the sampler's draws are exact samples."""

from __future__ import annotations

import dataclasses

import httpx
import openai
import pytest
import torch
from server_helpers import Script, tiny_server

from ostinato.runtime.engine.loader import load_engine
from ostinato.server.sampling import Sampler, Sampling

PROMPT = torch.randint(3, 1000, (40,), generator=torch.Generator().manual_seed(21)).tolist()
MORE = torch.randint(3, 1000, (15,), generator=torch.Generator().manual_seed(22)).tolist()


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory, kernel_dir):
    work = tmp_path_factory.mktemp("spec_server")
    script = Script()
    srv, base, app, engine, _ = tiny_server(tiny_ckpt, work, kernel_dir, script, {"speculative": "mtp"},
                                            api_key="k")
    yield {"url": base.removesuffix("/v1"), "work": work, "engine": engine, "script": script,
           "client": openai.OpenAI(base_url=base, api_key="k", max_retries=0)}
    srv.should_exit = True


def plain_greedy(engine, ids, n):
    es, eos = engine.new_session(), engine.model.config.eos_token_id
    gen = [int(es.prefill(ids, last_only=True)[-1].argmax())]
    while len(gen) < n and gen[-1] != eos:
        gen.append(int(es.decode(gen[-1]).argmax()))
    return gen


def complete(server, ids, n, **kw):
    r = server["client"].completions.create(model="tiny", prompt=ids, max_tokens=n,
                                            extra_body={"return_token_ids": True}, **kw)
    return r.choices[0].model_extra["token_ids"], r


def drafts(server):
    r = httpx.get(server["url"] + "/metrics", headers={"authorization": "Bearer k"}).text
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in r.splitlines() if line.startswith(
        ("ostinato_drafted", "ostinato_accepted")))}


@pytest.mark.slow  # a compiled plan's engine behind the server, and a plain one beside it
def test_greedy_replies_equal_plain_decoding_over_two_turns(server, tiny_ckpt):
    assert server["engine"].speculative
    before = drafts(server)
    first, _ = complete(server, PROMPT, 30)
    turn2 = PROMPT + first + MORE
    second, r2 = complete(server, turn2, 20)
    assert r2.usage.prompt_tokens_details.cached_tokens >= len(PROMPT) + len(first) - 1  # the session went on
    plain = load_engine(server["work"] / "plan.yaml", tiny_ckpt, device="cpu", speculative="off")
    try:
        assert not plain.speculative
        assert first == plain_greedy(plain, PROMPT, 30)
        assert second == plain_greedy(plain, turn2, 20)
    finally:
        plain.close()
    after = drafts(server)
    drafted = after["ostinato_drafted_tokens_total"] - before["ostinato_drafted_tokens_total"]
    accepted = after["ostinato_accepted_tokens_total"] - before["ostinato_accepted_tokens_total"]
    assert 20 <= drafted <= 48 and 0 <= accepted <= drafted  # one draft per step; a kept one saves a step


@pytest.mark.slow
def test_drafts_that_agree_are_kept(server):
    """A hook that forces the reply reshapes the drafts too: every draft is the forced token, so every one
    is kept, and the reply is the script (each token emitted once, in order, the session holding it)."""
    script = [int(t) for t in torch.randint(3, 1000, (17,), generator=torch.Generator().manual_seed(23))]
    server["script"].tokens = script
    try:
        before = drafts(server)
        got, r = complete(server, PROMPT, 17)
        after = drafts(server)
    finally:
        server["script"].tokens = None
    assert got == script
    drafted = after["ostinato_drafted_tokens_total"] - before["ostinato_drafted_tokens_total"]
    accepted = after["ostinato_accepted_tokens_total"] - before["ostinato_accepted_tokens_total"]
    assert accepted == drafted == 8  # 17 tokens: the first from the prefill, then 8 steps of 2
    again, r2 = complete(server, PROMPT + got + MORE, 1)
    assert r2.usage.prompt_tokens_details.cached_tokens >= len(PROMPT) + len(got) - 1


def plain_sampled(engine, ids, n, params):
    es, eos, sampler = engine.new_session(), engine.model.config.eos_token_id, Sampler(params)
    logits, gen = es.prefill(ids, last_only=True)[-1], []
    while len(gen) < n and (not gen or gen[-1] != eos):
        gen.append(sampler.pick(logits).token)
        sampler.accept(gen[-1])
        if len(gen) < n:
            logits = es.decode(gen[-1])
    return gen


@pytest.mark.slow
def test_sampled_replies_are_plain_samplings_under_the_same_seed(server, tiny_ckpt):
    """Drafts are picked with the reply's own noise and checked like greedy picks, so a seeded reply is
    token for token the one plain sampling draws, on a fresh or a cached session alike: over 30 seeds the
    speculative replies are plain sampling's draws, so their distribution is plain sampling's."""
    params = dict(temperature=1.0, top_p=0.95)
    plain = load_engine(server["work"] / "plan.yaml", tiny_ckpt, device="cpu", speculative="off")
    before = drafts(server)
    try:
        for seed in range(30):
            want = plain_sampled(plain, PROMPT, 6, Sampling(seed=seed, **params))
            for _ in range(2 if seed < 2 else 1):  # again on the cached session, whose drafter restarted
                got, _ = complete(server, PROMPT, 6, seed=seed, **params)
                assert got == want, seed
    finally:
        plain.close()
    after = drafts(server)
    drafted, accepted = (after[k] - before[k] for k in ("ostinato_drafted_tokens_total",
                                                        "ostinato_accepted_tokens_total"))
    assert 0 < accepted < drafted  # both paths ran (the shared noise makes flat distributions agree often)


def test_a_draw_is_an_exact_sample_and_a_function_of_seed_and_index():
    """pick() draws from probs(): over 6000 seeds the first token's frequencies are the distribution (within
    5 standard errors); one seed and index always give the same token, another index another draw."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, generator=g) * 2
    params = Sampling(temperature=1.3, top_k=5, top_p=0.8)
    p = Sampler(Sampling(temperature=1.3, top_k=5, top_p=0.8, seed=0)).probs(logits)
    assert (p > 0).sum() < 5 and abs(float(p.sum()) - 1) < 1e-12  # top_k and top_p cut
    n = 6000
    draws = torch.tensor([Sampler(dataclasses.replace(params, seed=s)).pick(logits).token for s in range(n)])
    counts = torch.bincount(draws, minlength=6).double()
    err = 5 * (p * (1 - p) / n).sqrt() + 1e-12
    assert ((counts / n - p).abs() <= err).all(), (counts / n, p)
    s = Sampler(Sampling(temperature=1.0, seed=9))
    first = [s.pick(logits).token for _ in range(3)]
    assert first == [first[0]] * 3  # no state changes between picks ...
    seq = []
    for _ in range(40):
        seq.append(s.pick(logits).token)
        s.accept(seq[-1])
    assert len(set(seq)) > 1  # ... accept() moves to the next index's noise
    greedy = Sampler(Sampling()).probs(logits)
    assert greedy[int(logits.argmax())] == 1.0 and greedy.sum() == 1.0
    assert Sampler(params).probs(logits, forced=2)[2] == 1.0
