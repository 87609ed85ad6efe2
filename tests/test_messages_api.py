"""Anthropic's Messages API on the tiny model, driven by the official anthropic client over loopback:
plain and streamed replies, a two-turn tool round trip that prefills only the appended turn (also when
the first turn came through the OpenAI API), forced tool choice, stop sequences, the thinking budget,
a tool call cut by max_tokens, count_tokens and errors."""

import json

import anthropic
import httpx
import openai
import pytest
from server_helpers import Script, tiny_server

from ostinato.server.chat_encoding import END_THINK
from ostinato.server.dsml import render_tool_calls

pytestmark = pytest.mark.slow  # a compiled plan's engine (C++ kernels) behind the server

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"]}}
OPENAI_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": TOOL["input_schema"]}}
CALL = {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
KEY = {"x-api-key": "secret", "anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory, kernel_dir):
    script = Script()
    # plain decoding: the route counts below are the main model's alone (the MTP block would add its own
    # pairs' routes; tests/test_server_speculative.py serves with it)
    srv, base, _, engine, tok = tiny_server(tiny_ckpt, tmp_path_factory.mktemp("messages"), kernel_dir, script,
                                            {"speculative": "off"}, api_key="secret", cache_sessions=2)
    url = base.removesuffix("/v1")
    yield {"url": url, "client": anthropic.Anthropic(base_url=url, api_key="secret", max_retries=0),
           "openai": openai.OpenAI(base_url=base, api_key="secret", max_retries=0),
           "engine": engine, "tok": tok, "script": script}
    srv.should_exit = True


def ids(server, text):
    return server["tok"].encode(text, add_special_tokens=False).ids


def next_turn(server, result: str) -> int:
    """Tokens a tool round trip appends after the assistant's call: what the next request must prefill."""
    turn = f"<｜end▁of▁sentence｜><｜User｜><tool_result>{result}</tool_result><｜Assistant｜></think>"
    return len(ids(server, turn))


def forced(server, tokens, fn):
    server["script"].tokens = tokens
    try:
        return fn()
    finally:
        server["script"].tokens = None


def routes(server) -> int:
    c = server["engine"].executor.counters
    return c.routes_hot + c.routes_cold


def ask(server, messages, **kw):
    return server["client"].messages.create(model="tiny", messages=messages, max_tokens=kw.pop("max_tokens", 4), **kw)


def test_plain_and_streamed_replies_agree_and_are_greedy(server):
    msgs = [{"role": "user", "content": "Hello there"}]
    whole = ask(server, msgs, system="Be brief.")
    assert whole.type == "message" and whole.role == "assistant" and whole.model == "tiny"
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 4
    assert [b.type for b in whole.content] == ["text"]
    with server["client"].messages.stream(model="tiny", messages=msgs, max_tokens=4, system="Be brief.") as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.stop_reason == "max_tokens"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_stop", "message_delta"} <= set(kinds)
    # the repeated prompt was a real cache hit: all of it reused, nothing computed again for it
    assert final.usage.cache_read_input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert final.usage.input_tokens == 0


def test_a_repeated_prompt_is_not_computed_again(server):
    """The same prompt twice: usage says it was all cached, and the engine routes no token for it (the
    old code reported len - 1 tokens cached while it re-prefilled every one of them)."""
    msgs = [{"role": "user", "content": "Say something new"}]
    first = ask(server, msgs, max_tokens=3)
    before = routes(server)
    again = ask(server, msgs, max_tokens=1)  # max_tokens 1: no decode step, only the prompt could be computed
    assert routes(server) == before
    assert again.usage.cache_read_input_tokens == first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert first.content[0].text.startswith(again.content[0].text)  # greedy: the same first token


def test_tool_round_trip_prefills_only_the_appended_turn(server):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = forced(server, ids(server, render_tool_calls([CALL])),
               lambda: ask(server, msgs, system="You help.", tools=[TOOL], max_tokens=120))
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["tool_use"]
    use = r.content[0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                           "content": [{"type": "text", "text": "sunny"}]}]}]
    before = routes(server)
    r2 = ask(server, msgs, system="You help.", tools=[TOOL], max_tokens=1)
    appended = next_turn(server, "sunny")
    assert r2.usage.input_tokens == appended and r2.usage.cache_read_input_tokens > appended
    config = server["engine"].model.config
    # only the appended tokens ran through the experts
    assert routes(server) - before == appended * config.num_hidden_layers * config.num_experts_per_tok


def test_an_openai_turn_then_a_messages_turn_share_the_session(server):
    """One conversation, the first turn through /v1/chat/completions, the next through /v1/messages: the
    second prefills only what the first did not hold (one rendering for both APIs)."""
    msgs = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Rome?"}]
    call = {**CALL, "function": {**CALL["function"], "arguments": '{"city": "Rome"}'}}
    r = forced(server, ids(server, render_tool_calls([call])),
               lambda: server["openai"].chat.completions.create(model="tiny", messages=msgs, tools=[OPENAI_TOOL],
                                                                max_tokens=120))
    c = r.choices[0].message.tool_calls[0]
    history = [{"role": "user", "content": "Weather in Rome?"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": c.id, "name": "get_weather",
                                                  "input": json.loads(c.function.arguments)}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": "rain"}]}]
    r2 = ask(server, history, system="You help.", tools=[TOOL], max_tokens=1)
    appended = next_turn(server, "rain")
    assert r2.usage.input_tokens == appended


def test_forced_tool_choice_gives_arguments_of_the_schema(server):
    """The random tiny model would never call a tool: the forced choice makes it, typed by the schema."""
    pick = {"name": "pick", "input_schema": {"type": "object", "required": ["n", "unit"], "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 9}, "unit": {"enum": ["C", "F"]}}}}
    one = {"disable_parallel_tool_use": True}  # else the model may go on to a second call
    for choice, name in (({"type": "tool", "name": "pick", **one}, "pick"), ({"type": "any", **one}, None)):
        r = ask(server, [{"role": "user", "content": "Weather?"}], tools=[TOOL, pick], tool_choice=choice,
                max_tokens=200)
        use = [b for b in r.content if b.type == "tool_use"]
        assert len(use) == 1 and (name is None or use[0].name == name)
        if use[0].name == "pick":
            assert r.stop_reason == "tool_use"
            assert 0 <= use[0].input["n"] <= 9 and use[0].input["unit"] in ("C", "F") and len(use[0].input) == 2
        else:  # get_weather: a string of the model's, possibly cut by max_tokens
            assert set(use[0].input) <= {"city"}


def test_tool_choice_none_never_calls(server):
    r = forced(server, ids(server, render_tool_calls([CALL])),
               lambda: ask(server, [{"role": "user", "content": "w?"}], tools=[TOOL], tool_choice={"type": "none"},
                           max_tokens=3))
    assert all(b.type == "text" for b in r.content) and r.stop_reason != "tool_use"


def test_stop_sequences_cut_the_text_and_are_reported(server):
    tokens = ids(server, "Hello world. END more text")
    r = forced(server, tokens, lambda: ask(server, [{"role": "user", "content": "hi"}], stop_sequences=["END", "zzz"],
                                           max_tokens=len(tokens) + 2))
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "END"
    assert r.content[0].text == "Hello world. "
    server["script"].tokens = tokens
    try:
        with server["client"].messages.stream(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              stop_sequences=["END"], max_tokens=len(tokens) + 2) as s:
            final = s.get_final_message()
    finally:
        server["script"].tokens = None
    assert final.stop_sequence == "END" and final.content[0].text == "Hello world. "


def test_thinking_is_a_block_and_its_budget_is_kept(server):
    tok = server["tok"]
    reasoning, answer = ids(server, "think think think"), ids(server, "Answer")
    end = tok.token_to_id(END_THINK)
    budget = 2
    assert len(reasoning) > budget and end not in reasoning
    # the script keeps reasoning at position `budget`; the budget forces </think> there, then the answer follows
    script = reasoning[:budget + 1] + answer
    r = forced(server, script, lambda: ask(server, [{"role": "user", "content": "q"}], max_tokens=12,
                                           thinking={"type": "enabled", "budget_tokens": budget}))
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == tok.decode(reasoning[:budget]) and r.content[1].text == "Answer"
    assert r.stop_reason == "end_turn"


def test_a_tool_call_cut_by_max_tokens_keeps_what_was_generated(server):
    call = render_tool_calls([{**CALL, "function": {**CALL["function"], "arguments": '{"city": "Paris France"}'}}])
    tokens = ids(server, call)
    cut = next(n for n in range(len(tokens)) if server["tok"].decode(tokens[:n]).endswith("Paris"))
    r = forced(server, tokens, lambda: ask(server, [{"role": "user", "content": "w?"}], tools=[TOOL], max_tokens=cut))
    assert r.stop_reason == "max_tokens"
    assert r.content[-1].type == "tool_use" and r.content[-1].input == {"city": "Paris"}
    o = forced(server, tokens, lambda: server["openai"].chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "w?"}], tools=[OPENAI_TOOL], max_tokens=cut))
    assert o.choices[0].finish_reason == "length"
    assert o.choices[0].message.tool_calls[0].function.arguments == '{"city": "Paris'


def test_count_tokens_is_the_prompt_a_request_prefills(server):
    msgs = [{"role": "user", "content": "Count me"}]
    n = server["client"].messages.count_tokens(model="tiny", messages=msgs, system="s", tools=[TOOL]).input_tokens
    r = ask(server, msgs, system="s", tools=[TOOL], max_tokens=1)
    assert n == r.usage.input_tokens + r.usage.cache_read_input_tokens


def test_errors_have_anthropics_shape(server):
    c = server["client"]
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="claude-x", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    assert e.value.body["error"]["type"] == "not_found_error" and "'tiny'" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="tiny", max_tokens=1, messages=[{"role": "user", "content": [
            {"type": "text", "text": "look"}, {"type": "image", "source": {"type": "url", "url": "http://x"}}]}])
    assert "messages[0].content[1].type" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server["url"], api_key="wrong", max_retries=0).messages.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    r = httpx.post(server["url"] + "/v1/messages", headers=KEY, json={"model": "tiny", "max_tokens": 1, "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": "no result"}], "tools": [TOOL]})
    assert r.status_code == 400 and r.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "messages[1].content: tool_use ids t1 have no tool_result block in the next user message"}}


def test_the_stream_is_anthropics_event_sequence(server):
    """Raw SSE, as any client (not only the SDK) reads it: event names and their order."""
    body = {"model": "tiny", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.stream("POST", server["url"] + "/v1/messages", headers=KEY, json=body) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in data] == names  # each event's data names its event
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert data[0]["message"]["usage"]["input_tokens"] + data[0]["message"]["usage"]["cache_read_input_tokens"] > 0
    assert data[-2]["delta"]["stop_reason"] == "max_tokens" and data[-2]["usage"]["output_tokens"] == 3


def test_the_load_test_with_openai_and_anthropic_clients_gets_every_answer_right(server, capsys):
    """bench/load_test.py against this server: 4 clients, two per API, each answer its own and the same
    whichever API asked."""
    from ostinato.bench import load_test

    code = load_test.main(["--url", server["url"] + "/v1", "--model", "tiny", "--api-key", "secret",
                           "--clients", "4", "--seconds", "4", "--max-tokens", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "errors 0" in out and "openai" in out and "anthropic" in out
