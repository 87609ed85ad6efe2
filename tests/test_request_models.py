"""The typed request models (server/openai_api/, server/anthropic_api/) know every field the official SDKs
define: the SDKs' request param TypedDicts are walked from each endpoint's params down through messages,
content blocks, tool calls and tools, and every key must be a field of the model the server checks that
object with. A TypedDict the walk has no model for is a block, tool or part this server refuses whole, by
its type (listed, so a new SDK type fails here until someone decides). Then the official clients' own
`model_dump()` of a reply, sent back, is accepted by the real server."""

import typing

import anthropic
import openai
import pytest
import typing_extensions
from anthropic.types import message_count_tokens_params, message_create_params
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params
from pydantic import BaseModel

from ostinato.chat_encodings import ABSOLUTE_MAXIMUM, BEYOND_MAXIMUM
from ostinato.server.anthropic_api import (
    BLOCKS,
    CountTokensRequest,
    MessageParam,
    MessagesRequest,
    Metadata,
    OutputConfig,
    Thinking,
    Tool,
    ToolChoice,
)
from ostinato.server.anthropic_api.parts import TextBlock, ToolResultBlock
from ostinato.server.errors import APIError
from ostinato.server.fields import RequestModel, StreamOptions
from ostinato.server.messages_request import parse_messages
from ostinato.server.openai_api import (
    MESSAGES,
    ChatCompletionRequest,
    CompletionRequest,
    FunctionTool,
    TextPart,
    ToolCall,
)
from ostinato.server.openai_api.messages import AssistantMessage, Message


def _literal(td, key="type"):
    """The one value a TypedDict's Literal field allows (None if it allows several or is not a Literal)."""
    ann = typing.get_type_hints(td, include_extras=True).get(key)
    while ann is not None and typing.get_origin(ann) is not typing.Literal:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = args[0] if args else None
    return typing.get_args(ann)[0] if ann is not None and len(typing.get_args(ann)) == 1 else None


def by_type(table: dict):
    return lambda td: table.get(_literal(td))


# Fields the models keep untyped (checked further on, where the object is read): which model that is, or a
# function of the SDK's TypedDict giving it (None: a type refused whole).
NESTED = {
    (CountTokensRequest, "messages"): MessageParam,
    (CountTokensRequest, "system"): TextBlock,
    (CountTokensRequest, "tools"): by_type({"custom": Tool}),
    (CountTokensRequest, "tool_choice"): ToolChoice,
    (CountTokensRequest, "thinking"): Thinking,
    (MessagesRequest, "metadata"): Metadata,
    (MessageParam, "content"): by_type(BLOCKS),
    (ToolResultBlock, "content"): by_type({"text": TextBlock}),
    (ChatCompletionRequest, "messages"): lambda td: MESSAGES[_literal(td, "role")],
    (ChatCompletionRequest, "tools"): by_type({"function": FunctionTool}),
    (ChatCompletionRequest, "stream_options"): StreamOptions,
    (CompletionRequest, "stream_options"): StreamOptions,
    (Message, "content"): by_type({"text": TextPart}),
    (AssistantMessage, "tool_calls"): by_type({"function": ToolCall}),
}
# Objects the server reads as a whole elsewhere (tool_choice.py, constrained.py) or ignores / refuses whole
OPAQUE = {(ChatCompletionRequest, k) for k in ("tool_choice", "response_format", "audio", "prediction", "metadata",
                                                "web_search_options", "moderation", "prompt_cache_options",
                                                "function_call", "functions")}
OPAQUE |= {(TextBlock, "citations"), (OutputConfig, "format"), (MessagesRequest, "container"),
           (MessagesRequest, "diagnostics"), (Tool, "input_schema"), (TextPart, "prompt_cache_breakpoint"),
           (AssistantMessage, "audio"), (AssistantMessage, "function_call"), (AssistantMessage, "annotations")}


def _typeddicts(ann) -> list:
    """The TypedDicts an annotation allows, through Union, Optional, Required, Annotated, Iterable and List."""
    if typing_extensions.is_typeddict(ann):
        return [ann]
    if typing.get_origin(ann) in (dict, typing.Literal):
        return []
    return [td for a in typing.get_args(ann) for td in _typeddicts(a)]


def _target(model, key):
    for cls in model.__mro__:
        if (cls, key) in NESTED:
            return NESTED[(cls, key)]
        if (cls, key) in OPAQUE:
            return "opaque"
    field = model.model_fields.get(key) or next(f for f in model.model_fields.values() if f.alias == key)
    found = [a for a in typing.get_args(field.annotation) + (field.annotation,)
             if isinstance(a, type) and issubclass(a, BaseModel)]
    return found[0] if found else None


def walk(td, model, path: str, missing: list, refused: set, seen: set) -> None:
    if (td, model) in seen:
        return
    seen.add((td, model))
    hints = typing.get_type_hints(td, include_extras=True)
    missing += [f"{path}.{k} ({td.__name__} -> {model.__name__})" for k in hints if k not in model.fields()]
    for key, ann in hints.items():
        subs = _typeddicts(ann)
        if not subs or key not in model.fields():
            continue
        target = _target(model, key)
        assert target is not None, f"{path}.{key}: {model.__name__} holds {[s.__name__ for s in subs]} untyped"
        if target == "opaque":
            continue
        for sub in subs:
            m = target if isinstance(target, type) else target(sub)
            if m is None:
                refused.add(sub.__name__)
            else:
                walk(sub, m, f"{path}.{key}", missing, refused, seen)


ROOTS = [
    (chat_create_params.CompletionCreateParamsStreaming, ChatCompletionRequest, "chat.completions"),
    (completion_create_params.CompletionCreateParamsStreaming, CompletionRequest, "completions"),
    (message_create_params.MessageCreateParamsStreaming, MessagesRequest, "messages"),
    (message_count_tokens_params.MessageCountTokensParams, CountTokensRequest, "messages.count_tokens"),
]


@pytest.mark.parametrize("td, model, path", ROOTS, ids=[r[2] for r in ROOTS])
def test_every_field_the_sdks_define_is_a_field_of_our_models(td, model, path):
    """The old server refused anthropic's own ToolUseBlockParam.caller and toolset_name (and many more)."""
    missing, refused = [], set()
    walk(td, model, path, missing, refused, set())
    assert missing == [], f"{openai.__version__=} {anthropic.__version__=}: fields the models lack:\n" + \
        "\n".join(missing)
    # what is refused whole is refused by its type: a content block, tool or part this server does not read
    for name in refused:
        assert not name.startswith(("TextBlock", "ToolUseBlock", "ToolResultBlock", "ThinkingBlock",
                                    "ChatCompletionContentPartText", "ToolParam")), name


def test_refused_types_are_named_by_their_type():
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}
    with pytest.raises(APIError) as e:
        parse_messages(body)
    assert e.value.param == "messages[0].content[0].type"


@pytest.mark.parametrize("block", [
    {"type": "tool_use", "id": "t", "name": "f", "input": {}, "caller": {"type": "direct"}, "toolset_name": None},
    {"type": "tool_use", "id": "t", "name": "f", "input": {}, "caller": None, "cache_control": None},
    {"type": "text", "text": "x", "citations": None, "cache_control": {"type": "ephemeral", "ttl": "1h"}},
])
def test_sdk_fields_in_blocks_are_accepted(block):
    """What anthropic's model_dump() of a reply holds: the old server refused caller and toolset_name."""
    use = block["type"] == "tool_use"
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": [block]}]
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r",
                                                  "toolset_name": None}] if use else "b"})
    req = parse_messages({"model": "m", "max_tokens": 4, "messages": messages, "tools": [
        {"name": "f", "input_schema": {"type": "object"}, "eager_input_streaming": True, "strict": False}]})
    assert req.prompt_parts()


@pytest.mark.parametrize("extra, param", [
    ({"container": "c"}, "container"), ({"output_config": {"format": {"type": "json_schema", "schema": {}}}},
                                        "output_config.format"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}, "strict": True}]}, "tools[0].strict"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}, "defer_loading": True}]}, "tools[0].defer_loading"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "x"}}]}]},
     "messages[0].content[0].cache_control.type"),
])
def test_sdk_fields_this_server_cannot_honour_are_refused_by_name(extra, param):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(APIError) as e:
        parse_messages(body)
    assert e.value.status == 400 and e.value.param == param, e.value.message


@pytest.mark.parametrize("thinking, output_config, encoding, preamble", [
    ({"type": "adaptive"}, {"effort": "xhigh"}, "dsv4-0731", BEYOND_MAXIMUM),
    ({"type": "adaptive"}, {"effort": "medium"}, "dsv4-0731", ABSOLUTE_MAXIMUM),
    ({"type": "adaptive"}, {"effort": "low"}, "dsv4-0731", ""),
    ({"type": "adaptive"}, None, "dsv4-0731", ""),                                   # 0731's default: low
    ({"type": "enabled", "budget_tokens": 31_999}, None, "dsv4-0731", BEYOND_MAXIMUM),  # Claude Code's ultrathink
    ({"type": "enabled", "budget_tokens": 4_000}, None, "dsv4-0731", ""),
    ({"type": "enabled", "budget_tokens": 4_000}, {"effort": "max"}, "dsv4-0731", BEYOND_MAXIMUM),  # effort wins
    ({"type": "adaptive"}, {"effort": "xhigh"}, "dsv4", ABSOLUTE_MAXIMUM),           # the original's max
    ({"type": "adaptive"}, {"effort": "high"}, "dsv4", ""),
    ({"type": "disabled"}, {"effort": "max"}, "dsv4-0731", ""),                      # no thinking: no preamble
])
def test_anthropics_effort_and_budget_pick_the_releases_level(thinking, output_config, encoding, preamble):
    body = {"model": "m", "max_tokens": 40_000, "messages": [{"role": "user", "content": "hi"}], "thinking": thinking}
    if output_config:
        body["output_config"] = output_config
    text = "".join(t for t, _ in parse_messages(body, encoding=encoding).prompt_parts())
    assert text.startswith("<｜begin▁of▁sentence｜>" + preamble + "<｜User｜>hi")


@pytest.mark.parametrize("model, body, param", [
    (ChatCompletionRequest, {"verbosity": "low"}, "verbosity"), (ChatCompletionRequest, {"audio": {}}, "audio"),
    (ChatCompletionRequest, {"modalities": ["text", "audio"]}, "modalities"),
    (ChatCompletionRequest, {"frobnicate": 1}, "frobnicate"), (CompletionRequest, {"suffix": "x"}, "suffix"),
    (CompletionRequest, {"best_of": 3}, "best_of"),
])
def test_openai_fields_refused_by_name(model, body, param):
    with pytest.raises(APIError) as e:
        model.check(body).refused()
    assert e.value.param == param


def test_openai_fields_accepted():
    ChatCompletionRequest.check({"verbosity": "medium", "modalities": ["text"], "prediction": {"type": "content"},
                                 "prompt_cache_retention": "24h", "prompt_cache_options": {}}).refused()


def test_openai_message_fields():
    """A developer message is the system message; name, annotations and prompt_cache_breakpoint change nothing;
    the deprecated function role and an assistant's refusal are refused by name."""
    from ostinato.server.chat_encoding import ConversationError, render

    plain = render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert render([{"role": "developer", "content": "Be brief.", "name": "ops"},
                   {"role": "user", "content": [{"type": "text", "text": "hi", "prompt_cache_breakpoint": None}],
                    "name": "ann"}]) == plain
    for msgs, param in (([{"role": "function", "name": "f", "content": "x"}], "messages[0].role"),
                        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "refusal": "no"},
                          {"role": "user", "content": "b"}], "messages[1].refusal"),
                        ([{"role": "user", "content": "a", "colour": "red"}], "messages[0].colour")):
        with pytest.raises(ConversationError) as e:
            render(msgs)
        assert e.value.param == param


def test_base_model_refuses_unknown_keys_by_path():
    class Inner(RequestModel):
        a: int

    class Outer(RequestModel):
        inner: Inner

    with pytest.raises(APIError) as e:
        Outer.check({"inner": {"a": 1, "b": 2}}, "x")
    assert e.value.param == "x.inner.b"


# -- the official clients' model_dump() sent back to the real server ------------------------------------------
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
OPENAI_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": TOOL["input_schema"]}}
CALL = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory, kernel_dir):
    from server_helpers import Script, tiny_server

    script = Script()
    srv, base, _, _, tok = tiny_server(tiny_ckpt, tmp_path_factory.mktemp("dump"), kernel_dir, script,
                                       {"speculative": "off"})
    yield {"openai": openai.OpenAI(base_url=base, api_key="x", max_retries=0),
           "anthropic": anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="x", max_retries=0),
           "tok": tok, "script": script}
    srv.should_exit = True


def scripted(server, text, fn):
    from ostinato.server.dsml import render_tool_calls

    server["script"].tokens = server["tok"].encode(text + render_tool_calls([CALL]), add_special_tokens=False).ids
    try:
        return fn()
    finally:
        server["script"].tokens = None


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
@pytest.mark.parametrize("thinking", [False, True])
def test_openai_model_dump_of_a_reply_is_accepted_back(server, thinking):
    ask = [{"role": "user", "content": "Weather?"}]
    kw = dict(model="tiny", tools=[OPENAI_TOOL], max_tokens=200, extra_body={"thinking": thinking})
    r = scripted(server, "hmm</think>Let me look." if thinking else "Let me look.",
                 lambda: server["openai"].chat.completions.create(messages=ask, **kw))
    msg = r.choices[0].message
    assert msg.tool_calls and msg.content == "Let me look."
    dumped = msg.model_dump()  # refusal, annotations, audio, function_call (None) and reasoning_content
    assert {"refusal", "annotations", "audio", "function_call"} <= set(dumped)
    history = ask + [dumped, {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sun"}]
    again = server["openai"].chat.completions.create(messages=history, **{**kw, "max_tokens": 1})
    assert again.usage.prompt_tokens_details.cached_tokens > r.usage.prompt_tokens  # the reply's session reused


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("thinking", [False, True])
def test_anthropic_model_dump_of_a_reply_is_accepted_back(server, stream, thinking):
    """r.model_dump()["content"] as the next request's assistant turn: caller and toolset_name (None) in the
    tool_use block, citations in the text block, the thinking block's signature. The old server: 400."""
    ask = [{"role": "user", "content": "Weather?"}]
    kw = dict(model="tiny", tools=[TOOL], max_tokens=200,
              thinking={"type": "adaptive"} if thinking else anthropic.NOT_GIVEN)

    def create():
        if not stream:
            return server["anthropic"].messages.create(messages=ask, **kw)
        with server["anthropic"].messages.stream(messages=ask, **kw) as s:
            return s.get_final_message()
    r = scripted(server, "hmm</think>Let me look." if thinking else "Let me look.", create)
    content = r.model_dump()["content"]
    use = next(b for b in content if b["type"] == "tool_use")
    assert r.stop_reason == "tool_use"
    # what the SDK defines for a tool_use block comes back in its dump (caller and toolset_name, from 2.x on)
    assert set(anthropic.types.ToolUseBlock.model_fields) <= set(use)
    assert [b["type"] for b in content] == ["thinking"] * thinking + ["text", "tool_use"]
    history = ask + [{"role": "assistant", "content": content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sun"}]}]
    again = server["anthropic"].messages.create(messages=history, **{**kw, "max_tokens": 1})
    assert again.usage.cache_read_input_tokens > r.usage.input_tokens + r.usage.cache_read_input_tokens
