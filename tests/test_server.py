"""The OpenAI-compatible server on the tiny model, driven by the official openai client over loopback."""

import time

import httpx
import openai
import pytest
from server_helpers import Script, tiny_server

from ostinato.server.dsml import render_tool_calls

pytestmark = pytest.mark.slow  # a compiled plan's engine (C++ kernels) behind the server

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory, kernel_dir):
    script = Script()
    srv, base, app, _, tok = tiny_server(tiny_ckpt, tmp_path_factory.mktemp("server"), kernel_dir, script,
                                         api_key="secret", cache_sessions=2)
    url = base.removesuffix("/v1")
    yield {"url": url, "client": openai.OpenAI(base_url=base, api_key="secret", max_retries=0),
           "app": app, "tok": tok, "script": script}
    srv.should_exit = True


def metrics(server):
    out = {}
    r = httpx.get(server["url"] + "/metrics", headers={"authorization": "Bearer secret"})  # behind the key
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def ask(server, msgs, **kw):
    return server["client"].chat.completions.create(model="tiny", messages=msgs, max_tokens=kw.pop("max_tokens", 4),
                                                    **kw)


def test_models_health_auth(server):
    assert [m.id for m in server["client"].models.list()] == ["tiny"]
    assert httpx.get(server["url"] + "/health").json()["status"] == "ok"
    r = httpx.post(server["url"] + "/v1/chat/completions", json={"model": "tiny", "messages": []})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_stream_equals_whole_and_is_greedy(server):
    msgs = [{"role": "user", "content": "Hello there"}]
    whole = ask(server, msgs)
    assert whole.usage.completion_tokens == 4 and whole.choices[0].finish_reason == "length"
    chunks = list(ask(server, msgs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_tool_call_round_trip_prefills_only_the_appended_tokens(server):
    tok = server["tok"]
    msgs = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Paris?"}]
    server["script"].tokens = tok.encode(render_tool_calls([CALL]), add_special_tokens=False).ids
    try:
        r = ask(server, msgs, tools=TOOLS, max_tokens=120)
    finally:
        server["script"].tokens = None
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not m.content
    assert m.tool_calls[0].function.name == "get_weather" and m.tool_calls[0].function.arguments == '{"city": "Paris"}'
    before = metrics(server)
    msgs += [m.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "sunny"}]
    r2 = ask(server, msgs, tools=TOOLS, max_tokens=1)
    after = metrics(server)
    appended = len(tok.encode("<｜end▁of▁sentence｜><｜User｜><tool_result>sunny</tool_result><｜Assistant｜></think>",
                              add_special_tokens=False).ids)
    assert after["ostinato_prefilled_tokens_total"] - before["ostinato_prefilled_tokens_total"] == appended
    assert r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - appended
    assert after["ostinato_cache_hits_total"] == before["ostinato_cache_hits_total"] + 1


def test_streamed_tool_call(server):
    server["script"].tokens = server["tok"].encode("ok" + render_tool_calls([CALL]), add_special_tokens=False).ids
    try:
        chunks = list(ask(server, [{"role": "user", "content": "w?"}], tools=TOOLS, max_tokens=120, stream=True))
    finally:
        server["script"].tokens = None
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    # incremental deltas: the first names the call (arguments ""), the rest carry pieces of its arguments
    assert [(tc.index, tc.function.name) for tc in calls if tc.function.name] == [(0, "get_weather")]
    assert "".join(tc.function.arguments for tc in calls) == '{"city": "Paris"}'
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("body, status, param", [
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ({"model": "tiny", "messages": [{"role": "assistant", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x " * 3000}]}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": "always"},
     400, "tool_choice"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "tool_choice"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": 5}, 400, "temperature"),
])
def test_bad_requests(server, body, status, param):
    r = httpx.post(server["url"] + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer secret"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and "type" in err and "code" in err


def test_malformed_json_and_openai_client_error(server):
    r = httpx.post(server["url"] + "/v1/chat/completions", content=b"{nope",
                   headers={"Authorization": "Bearer secret", "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.BadRequestError) as e:
        ask(server, [{"role": "user", "content": "x"}], tool_choice="always", tools=TOOLS)
    assert e.value.body["param"] == "tool_choice"
    assert ask(server, [{"role": "user", "content": "x"}], max_tokens=1).usage.completion_tokens == 1


def test_cancelled_stream_then_correct_request(server):
    msgs = [{"role": "user", "content": "Tell me a long story"}]
    stream = ask(server, msgs, stream=True, max_tokens=150)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    time.sleep(0.5)
    r = ask(server, msgs, max_tokens=6)
    fresh = [{"role": "system", "content": "z"}] + msgs  # no shared prefix: a cold session computes it
    assert metrics(server)["ostinato_cancelled_total"] >= 1
    cache = server["app"].state.server.cache
    assert all(len(e.session) == len(e.tokens) for e in cache.entries.values())
    assert r.usage.completion_tokens == 6 and ask(server, fresh, max_tokens=1).usage.completion_tokens == 1
    # the same question again reproduces the reply exactly (cache reuse did not change the answer)
    assert ask(server, msgs, max_tokens=6).choices[0].message.content == r.choices[0].message.content


def test_divergence_truncates_and_lru_evicts(server):
    """An edited last turn cuts the session back to the turn boundary before the edit (its snapshot) and
    reuses exactly that much: the tokens after it are prefilled again, and usage says so."""
    cache = server["app"].state.server.cache
    a = [{"role": "user", "content": "first question about cats, " + "with the long preamble agents send " * 6}]
    ra = ask(server, a, max_tokens=2)
    reply = {"role": "assistant", "content": ra.choices[0].message.content}
    ask(server, a + [reply, {"role": "user", "content": "more about cats"}], max_tokens=2)
    t0 = cache.stats.truncations
    re_ = ask(server, a + [reply, {"role": "user", "content": "more about dogs"}], max_tokens=2)
    assert cache.stats.truncations == t0 + 1
    assert re_.usage.prompt_tokens_details.cached_tokens == ra.usage.prompt_tokens  # the first turn's boundary
    assert ask(server, a, max_tokens=2).choices[0].message.content == ra.choices[0].message.content
    e0 = cache.stats.evictions
    for text in ("alpha", "beta", "gamma"):  # capacity 2: distinct sessions push the oldest out
        ask(server, [{"role": "system", "content": text}, {"role": "user", "content": "q"}], max_tokens=1)
    assert len(cache) == 2 and cache.stats.evictions >= e0 + 1


def test_completions_take_token_ids_and_return_them(server):
    """/v1/completions with a token-id prompt: the same greedy reply as the chat endpoint on the same ids,
    streamed equal to whole, the ids back (return_token_ids), and the next turn reusing the cached prefix."""
    from ostinato.server.chat_encoding import ChatOptions, encode, render
    tok, client = server["tok"], server["client"]
    msgs = [{"role": "user", "content": "Count to three"}]
    ids = encode(tok, render(msgs, [], ChatOptions(False, None)))
    chat = ask(server, msgs, max_tokens=5)
    whole = client.completions.create(model="tiny", prompt=ids, max_tokens=5, extra_body={"return_token_ids": True})
    gen = whole.choices[0].model_extra["token_ids"]
    assert len(gen) == 5 and whole.choices[0].text == tok.decode(gen, skip_special_tokens=False)
    assert whole.choices[0].text.startswith(chat.choices[0].message.content)  # chat holds DSML markup back
    assert whole.model_extra["prompt_token_ids"] == ids
    chunks = list(client.completions.create(model="tiny", prompt=ids, max_tokens=5, stream=True,
                                            extra_body={"return_token_ids": True}))
    assert [i for ch in chunks for i in ch.choices[0].model_extra.get("token_ids", [])] == gen
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    turn2 = ids + gen + tok.encode(" four five", add_special_tokens=False).ids
    r2 = client.completions.create(model="tiny", prompt=turn2, max_tokens=1)
    assert r2.usage.prompt_tokens_details.cached_tokens == len(ids) + len(gen) - 1  # the last token was never fed back
    assert r2.usage.prompt_tokens == len(turn2)


@pytest.mark.parametrize("extra, param", [({"echo": True}, "echo"), ({"prompt": [5, 10 ** 9]}, "prompt"),
                                          ({"prompt": [[1, 2], [3]]}, "prompt"), ({"prompt": ""}, "prompt"),
                                          ({"max_tokens": 10 ** 6}, "prompt"), ({"n": 2}, "n"),
                                          ({"return_token_ids": "yes"}, "return_token_ids")])
def test_completions_refuse_what_they_do_not_honour(server, extra, param):
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1, **extra}
    r = httpx.post(server["url"] + "/v1/completions", json=body, headers={"Authorization": "Bearer secret"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
