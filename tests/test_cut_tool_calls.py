"""A tool call cut off by max_tokens, on the tiny model behind a real server, through both official clients:
the reply never carries DSML markup as text (a call is a tool call as far as it got, or nothing), whole and
streamed agree, and the server takes the cut call back in the next request's history (OpenAI arguments
that are not yet JSON, Anthropic input parsed as far as it went), reusing the session it left."""

import anthropic
import openai
import pytest
from server_helpers import Script, tiny_server

from ostinato.server.dsml import DSML, render_tool_calls

pytestmark = pytest.mark.slow  # a compiled plan's engine (C++ kernels) behind the server

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                "required": ["city"]}}
OPENAI_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": TOOL["input_schema"]}}
ASK = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory, kernel_dir):
    script = Script()
    srv, base, app, _, tok = tiny_server(tiny_ckpt, tmp_path_factory.mktemp("cut"), kernel_dir, script,
                                         {"speculative": "off"})
    assert app.state.server.constraints is not None  # the forced calls below are llguidance's
    yield {"openai": openai.OpenAI(base_url=base, api_key="x", max_retries=0),
           "anthropic": anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="x", max_retries=0),
           "tok": tok, "script": script}
    srv.should_exit = True


def openai_reply(server, n, stream):
    """(content, [(name, arguments)], finish_reason) of a forced call cut at n tokens."""
    kw = dict(model="tiny", messages=ASK, tools=[OPENAI_TOOL], tool_choice="required", max_tokens=n)
    if not stream:
        r = server["openai"].chat.completions.create(**kw)
        m = r.choices[0].message
        return m.content or "", [(c.function.name, c.function.arguments) for c in m.tool_calls or []], \
            r.choices[0].finish_reason
    content, calls, reason = "", {}, None
    for chunk in server["openai"].chat.completions.create(**kw, stream=True):
        d = chunk.choices[0].delta
        content += d.content or ""
        for c in d.tool_calls or []:
            calls.setdefault(c.index, ["", ""])
            calls[c.index][0] += c.function.name or ""
            calls[c.index][1] += c.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    return content, [tuple(c) for c in calls.values()], reason


def anthropic_reply(server, n, stream):
    kw = dict(model="tiny", messages=ASK, tools=[TOOL], tool_choice={"type": "any"}, max_tokens=n)
    if not stream:
        return server["anthropic"].messages.create(**kw)
    with server["anthropic"].messages.stream(**kw) as s:
        return s.get_final_message()


def test_a_forced_call_cut_at_any_length_is_a_call_or_nothing_never_markup(server):
    """tool_choice required / any, cut at every max_tokens until its name is written: the old server returned
    the block's opening ('\\n\\n<｜DSML｜tool_calls>...') as the reply's text, with no call."""
    full = None
    for n in range(1, 48):
        replies = [openai_reply(server, n, stream) for stream in (False, True)]
        assert replies[0] == replies[1], n  # whole and streamed agree
        content, calls, reason = replies[0]
        assert content == "" and reason == "length", (n, content)  # a forced call has no text; it was cut
        assert all(name == "get_weather" for name, _ in calls)
        for stream in (False, True):
            m = anthropic_reply(server, n, stream)
            assert m.stop_reason == "max_tokens"
            assert [b.type for b in m.content] == ["tool_use"] * len(calls), (n, m.content)
            assert all(DSML not in str(b.model_dump()) for b in m.content)
        if calls:
            full = n
            break
    assert full is not None, "the call's name should be complete within 47 tokens"


def test_a_cut_call_comes_back_in_the_history_through_both_clients(server):
    """The cut call sent back, as each client hands it over (model_dump of the reply), with its tool result:
    accepted (the old server: 400 'arguments is not JSON'), and rendered the same way by both APIs."""
    tok, script = server["tok"], server["script"]
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris France"}'}}
    tokens = tok.encode(render_tool_calls([call]), add_special_tokens=False).ids
    cut = next(n for n in range(len(tokens)) if tok.decode(tokens[:n]).endswith("Paris"))
    script.tokens = tokens
    try:
        r = server["openai"].chat.completions.create(model="tiny", messages=ASK, tools=[OPENAI_TOOL], max_tokens=cut)
        a = server["anthropic"].messages.create(model="tiny", messages=ASK, tools=[TOOL], max_tokens=cut)
    finally:
        script.tokens = None
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and msg.tool_calls[0].function.arguments == '{"city": "Paris'
    history = ASK + [msg.model_dump(), {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sunny"}]
    again = server["openai"].chat.completions.create(model="tiny", messages=history, tools=[OPENAI_TOOL], max_tokens=1)
    # the session the cut reply left is reused: the prompt and the call as far as it was generated
    assert again.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens + cut - 2
    use = a.content[0]
    assert a.stop_reason == "max_tokens" and use.type == "tool_use" and use.input == {"city": "Paris"}
    turns = ASK + [{"role": "assistant", "content": a.model_dump()["content"]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    counted = server["anthropic"].messages.count_tokens(model="tiny", messages=turns, tools=[TOOL]).input_tokens
    assert counted == again.usage.prompt_tokens  # one rendering of the cut call, whichever API sent it
    assert server["anthropic"].messages.create(model="tiny", messages=turns, tools=[TOOL], max_tokens=1).usage


@pytest.mark.parametrize("arguments", ["{", '{"city": "Par', '{"city": "Paris", "da'])
def test_every_cut_the_server_returns_is_accepted_back(server, arguments):
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    r = server["openai"].chat.completions.create(model="tiny", messages=history, tools=[OPENAI_TOOL], max_tokens=1)
    assert r.usage.completion_tokens == 1


def test_arguments_that_start_no_json_object_are_refused(server):
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": 1} x'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    with pytest.raises(openai.BadRequestError) as e:
        server["openai"].chat.completions.create(model="tiny", messages=history, tools=[OPENAI_TOOL], max_tokens=1)
    assert e.value.body["param"] == "messages[1].tool_calls" and "start of one" in e.value.body["message"]


def both_apis(server, n, thinking, tools=True):
    """[(reasoning, content, calls)] of the scripted reply cut at n tokens: OpenAI whole and streamed,
    Anthropic whole and streamed (tool_choice auto: the script writes the text and the call)."""
    o = dict(model="tiny", messages=ASK, max_tokens=n, tools=[OPENAI_TOOL] if tools else None,
             extra_body={"thinking": thinking})
    r = server["openai"].chat.completions.create(**o)
    m = r.choices[0].message
    out = [(getattr(m, "reasoning_content", None) or "", m.content or "",
            [(c.function.name, c.function.arguments) for c in m.tool_calls or []])]
    reasoning, content, calls = "", "", {}
    for chunk in server["openai"].chat.completions.create(**o, stream=True):
        d = chunk.choices[0].delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
        for c in d.tool_calls or []:
            calls.setdefault(c.index, ["", ""])
            calls[c.index][0] += c.function.name or ""
            calls[c.index][1] += c.function.arguments or ""
    out.append((reasoning, content, [tuple(c) for c in calls.values()]))
    a = dict(model="tiny", messages=ASK, max_tokens=n, tools=[TOOL] if tools else anthropic.NOT_GIVEN,
             thinking={"type": "adaptive"} if thinking else anthropic.NOT_GIVEN)
    whole = server["anthropic"].messages.create(**a)
    with server["anthropic"].messages.stream(**a) as s:
        streamed = s.get_final_message()
    for msg in (whole, streamed):
        out.append(("".join(b.thinking for b in msg.content if b.type == "thinking"),
                    "".join(b.text for b in msg.content if b.type == "text"),
                    [b.name for b in msg.content if b.type == "tool_use"]))
    return out


@pytest.mark.parametrize("thinking", [False, True])
def test_text_then_a_call_cut_anywhere_never_ends_in_markup(server, thinking):
    """A reply of text and then a call (the model's own, tool_choice auto; in thinking mode after its
    reasoning), cut at every length up to the call's name: the text as far as it went, never a piece of
    the call's markup, on both APIs, whole and streamed; once the name is written, the call."""
    tok, script = server["tok"], server["script"]
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    text = ("hmm</think>" if thinking else "") + "Sure." + render_tool_calls([call])
    tokens = tok.encode(text, add_special_tokens=False).ids
    named = next(n for n in range(len(tokens)) if 'get_weather">' in tok.decode(tokens[:n], skip_special_tokens=False))
    said = next(n for n in range(len(tokens)) if tok.decode(tokens[:n]).endswith("Sure."))
    script.tokens = tokens
    try:
        # the text, then every cut in the call's opening (thinking mode: every third, the same parser's work)
        for n in [1] + list(range(said, named, 3 if thinking else 1)) + [named]:
            for reasoning, content, calls in both_apis(server, n, thinking):
                assert "<" not in content and DSML not in content and "\n" not in content, (n, content)
                assert "Sure.".startswith(content.replace("\ufffd", "")), (n, content)
                assert DSML not in reasoning
                assert [c if isinstance(c, str) else c[0] for c in calls] == (["get_weather"] if n == named else [])
    finally:
        script.tokens = None


def test_a_cut_in_the_middle_of_a_markup_character_is_not_text(server):
    """`<｜DSML｜` written as plain bytes and cut inside `｜` (a 3-byte character): neither the `<` nor the
    unfinished character reaches the client; the same cut after plain text still shows U+FFFD, as decoding
    the whole reply does."""
    tok, script = server["tok"], server["script"]
    bar = tok.encode("｜", add_special_tokens=False).ids
    assert len(bar) > 1 and tok.decode(bar[:1]) == "\ufffd"  # the character is split over byte tokens
    for lead, want in (("Sure.\n\n<", "Sure."), ("Sure", "Sure\ufffd")):
        script.tokens = tok.encode(lead, add_special_tokens=False).ids + bar[:1]
        try:
            for _, content, calls in both_apis(server, len(script.tokens), False):
                assert content == want and calls == []
        finally:
            script.tokens = None
