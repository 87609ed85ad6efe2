"""Every chat-completions field honoured (through the openai client, on the tiny model) or refused with a 400
naming it; streamed tool calls as incremental deltas; incremental detokenization.

The worker's logits hook shapes the model's logits so that a test knows what each field must do:
`forcing(ids)` leaves one token possible per step (then EOS), `scoring({id: logit})` leaves a few.
"""

import json
from contextlib import contextmanager

import httpx
import openai
import pytest
import torch
from server_helpers import tiny_server

from ostinato.server.dsml import render_tool_calls
from ostinato.server.sampling import LOGPROB_FLOOR, Sampler, Sampling
from ostinato.server.stop import StopMatcher

EOS = 1
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
ARGS = json.dumps({"city": 'Paris "FR"\n你好 é', "days": 3}, ensure_ascii=False)  # as the server writes them
CALLS = [{"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}},
         {"id": "b", "type": "function", "function": {"name": "now", "arguments": "{}"}}]


class Hook:
    fn = None

    def __call__(self, gen, logits):
        return logits if self.fn is None else self.fn(gen, logits)


def forcing(ids):
    def fn(gen, logits):
        out = logits.clone().fill_(float("-inf"))
        out[ids[len(gen)] if len(gen) < len(ids) else EOS] = 0.0
        return out
    return fn


def scoring(scores: dict):
    def fn(gen, logits):
        out = logits.clone().fill_(float("-inf"))
        for t, v in scores.items():
            out[t] = v
        return out
    return fn


@pytest.fixture(scope="module")
def server(tiny_ckpt, tmp_path_factory, kernel_dir):
    hook = Hook()
    srv, base, app, _, tok = tiny_server(tiny_ckpt, tmp_path_factory.mktemp("server_fields"), kernel_dir, hook,
                                         cache_sessions=2)
    yield {"url": base.removesuffix("/v1"), "client": openai.OpenAI(base_url=base, api_key="x", max_retries=0),
           "app": app, "tok": tok, "hook": hook}
    srv.should_exit = True


@contextmanager
def hooked(server, fn):
    server["hook"].fn = fn
    try:
        yield
    finally:
        server["hook"].fn = None


def ids(server, text):
    return server["tok"].encode(text, add_special_tokens=False).ids


def ask(server, content="Hi", stream=False, **kw):
    kw.setdefault("max_tokens", 4)
    r = server["client"].chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                                 stream=stream, **kw)
    return list(r) if stream else r


def streamed_text(chunks, field="content"):
    return "".join(getattr(c.choices[0].delta, field) or "" for c in chunks if c.choices)


# -- refusals ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, param", [
    ({"frobnicate": 1}, "frobnicate"), ({"functions": []}, "functions"), ({"n": 2}, "n"),
    ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"temperature": -1}, "temperature"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"1024": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": [1]}, "logit_bias"),
    ({"logprobs": "yes"}, "logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"seed": "7"}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": [""]}, "stop"), ({"stop": 5}, "stop"),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"), ({"user": 5}, "user"), ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
])
@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_refused_fields_name_their_param(server, extra, param):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, **extra}
    r = httpx.post(server["url"] + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_accepted_fields_through_the_client(server):
    r = ask(server, n=1, user="me", response_format={"type": "text"}, parallel_tool_calls=True, top_p=1,
            presence_penalty=0, frequency_penalty=0, logit_bias={}, stop=None, max_completion_tokens=2,
            extra_body={"thinking": False, "reasoning_effort": None})
    assert r.usage.completion_tokens == 2 and r.choices[0].logprobs is None


# -- stop -------------------------------------------------------------------------------------------------
TEXT = "Hello world. Stop here: more text"


@pytest.mark.parametrize("stop", ["Stop", ["zzz", "re: mo"], "world!"])
@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_stop_cuts_whole_and_stream_alike(server, stop):
    first = min((TEXT.find(s) for s in ([stop] if isinstance(stop, str) else stop) if s in TEXT), default=-1)
    with hooked(server, forcing(ids(server, TEXT))):
        whole = ask(server, stop=stop, max_tokens=40)
        chunks = ask(server, stop=stop, max_tokens=40, stream=True)
    want = TEXT[:first] if first >= 0 else TEXT
    assert whole.choices[0].message.content == streamed_text(chunks) == want
    assert whole.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == "stop"
    if first >= 0:  # generation stopped on the token that completed the stop sequence
        done = next(n for n in range(1, 40) if any(s in server["tok"].decode(ids(server, TEXT)[:n])
                                                   for s in ([stop] if isinstance(stop, str) else stop)))
        assert whole.usage.completion_tokens == done
    else:  # a prefix of the stop sequence ("world") was held back, then released
        assert whole.usage.completion_tokens == len(ids(server, TEXT)) + 1


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_stop_does_not_match_tool_call_markup(server):
    with hooked(server, forcing(ids(server, "ok" + render_tool_calls(CALLS[:1])))):
        r = ask(server, tools=TOOLS, stop=["city", "invoke"], max_tokens=200)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content == "ok"
    assert r.choices[0].message.tool_calls[0].function.arguments == CALLS[0]["function"]["arguments"]


def test_stop_matcher_holds_back_only_possible_starts():
    m = StopMatcher(("\nUser:", "END"))
    assert m.feed("Hi\nUs") == ("Hi", False)
    assert m.feed("ed E") == ("\nUsed ", False)
    assert m.feed("ND and more") == ("", True)
    assert m.feed("x") == ("", True)


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_completions_stop_and_legacy_logprobs(server):
    client = server["client"]
    with hooked(server, forcing(ids(server, TEXT))):
        r = client.completions.create(model="tiny", prompt="x", max_tokens=40, stop="here", logprobs=2)
        chunks = list(client.completions.create(model="tiny", prompt="x", max_tokens=40, stop="here", logprobs=2,
                                                stream=True))
    assert r.choices[0].text == "".join(c.choices[0].text for c in chunks) == "Hello world. Stop "
    assert r.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == "stop"
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert all(v == 0.0 for v in lp.token_logprobs) and all(len(d) <= 3 for d in lp.top_logprobs)
    assert "".join(lp.tokens) == TEXT[:len("".join(lp.tokens))] and lp.text_offset[:2] == [0, len(lp.tokens[0])]
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == lp.tokens
    for extra, param in (({"logprobs": 6}, "logprobs"), ({"top_logprobs": 1}, "top_logprobs"), ({"stop": 1}, "stop")):
        bad = httpx.post(server["url"] + "/v1/completions", json={"model": "tiny", "prompt": "x", **extra})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param


# -- logprobs ---------------------------------------------------------------------------------------------
@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_logprobs_whole_and_streamed_from_the_greedy_pick(server):
    whole = ask(server, "Tell me", logprobs=True, top_logprobs=3, max_tokens=6)
    chunks = ask(server, "Tell me", logprobs=True, top_logprobs=3, max_tokens=6, stream=True)
    entries = whole.choices[0].logprobs.content
    assert entries and len(entries) <= whole.usage.completion_tokens
    for e in entries:  # greedy: the picked token is the most likely one
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert e.logprob == e.top_logprobs[0].logprob <= 0
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
    if len(entries) == whole.usage.completion_tokens:  # no EOS: the tokens' bytes are the content
        assert bytes(b for e in entries for b in e.bytes).decode() == whole.choices[0].message.content
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-4)


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_logprobs_follow_logit_bias_and_bytes_of_split_characters(server):
    a, b = ids(server, "a")[0], ids(server, "b")[0]
    with hooked(server, scoring({a: 1.0, b: 0.9})):
        r = ask(server, logit_bias={str(b): 0.2}, logprobs=True, top_logprobs=3)
    e = r.choices[0].logprobs.content[0]
    want = torch.log_softmax(torch.tensor([1.0, 1.1]), 0)  # after logit_bias: b = 1.1 beats a = 1.0
    assert r.choices[0].message.content == "bbbb" and e.token == "b"
    assert e.logprob == pytest.approx(float(want[1]), abs=1e-6)
    assert [(t.token, round(t.logprob, 5)) for t in e.top_logprobs] == \
        [("b", round(float(want[1]), 5)), ("a", round(float(want[0]), 5)), (e.top_logprobs[2].token, LOGPROB_FLOOR)]
    split = ids(server, "é")
    with hooked(server, forcing(split)):
        r = ask(server, logprobs=True, max_tokens=len(split))
    entries = r.choices[0].logprobs.content
    assert len(entries) == 2 and bytes(entries[0].bytes + entries[1].bytes).decode() == "é"
    assert entries[0].token.startswith("bytes:\\x")


# -- sampling ---------------------------------------------------------------------------------------------
@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_penalties_follow_openais_definitions(server):
    a, b = ids(server, "a")[0], ids(server, "b")[0]
    with hooked(server, scoring({a: 1.0, b: 0.9})):
        assert ask(server).choices[0].message.content == "aaaa"
        # presence: a 1.0 - 0.5 once it occurred; b 0.9, then 0.4
        assert ask(server, presence_penalty=0.5).choices[0].message.content == "abaa"
        # frequency: a 1.0 - 0.3 x count; b 0.9 - 0.3 x count
        assert ask(server, frequency_penalty=0.3).choices[0].message.content == "abab"
        assert ask(server, logit_bias={str(b): 0.2}).choices[0].message.content == "bbbb"


def test_sampler_penalties_count_generated_tokens():
    s = Sampler(Sampling(presence_penalty=1.0, frequency_penalty=0.5))
    s.pick(torch.zeros(8))
    for t in (5, 5, 7):
        s.accept(t)
    x = s.adjust(torch.zeros(8))
    assert x.tolist() == [0, 0, 0, 0, 0, -2.0, 0, -1.5]


def test_top_k_draws_among_the_k_most_likely_only():
    """The Messages API's top_k: with k = 2 only the two best tokens are ever drawn, in the proportion of
    their renormalized probabilities (0.5 / 0.5 here); the thinking budget forces </think> once spent."""
    logits = torch.tensor([3.0, 3.0, 2.9, 2.9, -1.0])
    s, draws = Sampler(Sampling(temperature=1.0, top_k=2, seed=0)), []
    for _ in range(400):  # a reply's 400 tokens: each index draws its own noise
        draws.append(s.pick(logits).token)
        s.accept(draws[-1])
    assert set(draws) == {0, 1} and 150 < draws.count(0) < 250
    s = Sampler(Sampling(think_budget=2, end_think=4))
    picks = []
    for _ in range(4):
        picks.append(s.pick(logits).token)
        s.accept(picks[-1])
    assert picks == [0, 0, 4, 0]  # two reasoning tokens, the forced end, then the model's own again


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_top_p_keeps_the_nucleus_and_seed_repeats(server):
    a, b, c = (ids(server, ch)[0] for ch in "abc")
    with hooked(server, scoring({a: 1.0, b: 0.9, c: 0.0})):  # p(a) = 0.43: a nucleus of 0.3 is {a}
        assert {ask(server, temperature=1, top_p=0.3, seed=s).choices[0].message.content for s in range(5)} == {"aaaa"}
        free = {ask(server, temperature=1, seed=s, max_tokens=8).choices[0].message.content for s in range(5)}
    assert len(free) > 1 and all(set(t) <= set("abc") for t in free)
    one = ask(server, "Once upon", temperature=1.5, seed=1234, max_tokens=8)
    assert ask(server, "Once upon", temperature=1.5, seed=1234, max_tokens=8).choices[0].message.content == \
        one.choices[0].message.content == streamed_text(ask(server, "Once upon", temperature=1.5, seed=1234,
                                                            max_tokens=8, stream=True))
    others = {ask(server, "Once upon", temperature=1.5, seed=s, max_tokens=8).choices[0].message.content
              for s in range(4)}
    assert len(others | {one.choices[0].message.content}) > 1


# -- structured output ------------------------------------------------------------------------------------
class ForceText:
    """A stand-in for the constraint factory's objects: allows exactly one token sequence, then is done."""

    def __init__(self, want):
        self.want, self.at, self.masked = want, 0, []

    def mask(self, logits):
        self.masked.append(logits.dtype)
        out = torch.full_like(logits, float("-inf"))
        out[self.want[self.at]] = 0.0
        return out

    def advance(self, token):
        assert token == self.want[self.at]
        self.at += 1

    def done(self):
        return self.at == len(self.want)


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_response_format_goes_to_the_constraint_factory(server):
    want, seen = ids(server, '{"a": 1}'), []

    def factory(response_format, tokenizer):
        seen.append((response_format, tokenizer))
        return ForceText(want)
    s = server["app"].state.server
    real, s.constraints = s.constraints, factory
    try:
        r = ask(server, response_format={"type": "json_object"}, max_tokens=50)
        with pytest.raises(openai.BadRequestError) as e:
            ask(server, tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})
    finally:
        s.constraints = real
    assert r.choices[0].message.content == '{"a": 1}' and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == len(want)
    assert seen[0][0] == {"type": "json_object"} and seen[0][1] is server["tok"]
    assert e.value.body["param"] == "response_format"


# -- tool calls -------------------------------------------------------------------------------------------
def reassembled(chunks):
    """(name, arguments) per call from streamed deltas, checking OpenAI's delta shape on the way."""
    calls = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.id is not None:
                assert d.type == "function" and d.function.name and d.function.arguments == ""
                assert d.index == len(calls)
                calls[d.index] = [d.function.name, ""]
            else:
                assert d.function.name is None
                calls[d.index][1] += d.function.arguments
    return [tuple(v) for v in calls.values()]


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_streamed_tool_calls_are_incremental_and_equal_whole(server):
    with hooked(server, forcing(ids(server, "Let me look." + render_tool_calls(CALLS)))):
        whole = ask(server, tools=TOOLS, max_tokens=300)
        chunks = ask(server, tools=TOOLS, max_tokens=300, stream=True)
    m = whole.choices[0].message
    assert m.content == streamed_text(chunks) == "Let me look."
    want = [(c["function"]["name"], c["function"]["arguments"]) for c in CALLS]
    assert [(c.function.name, c.function.arguments) for c in m.tool_calls] == reassembled(chunks) == want
    assert json.loads(want[0][1]) == {"city": 'Paris "FR"\n你好 é', "days": 3}
    pieces = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or []) if d.index == 0]
    assert len(pieces) > 3  # the first call's arguments came in several pieces, as they were generated
    assert whole.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == "tool_calls"
    # generation ended one token after the block (the EOS the hook forces there)
    assert whole.usage.completion_tokens == len(ids(server, "Let me look." + render_tool_calls(CALLS))) + 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_parallel_tool_calls_false_stops_after_the_first_call(server, stream):
    text = render_tool_calls(CALLS)
    with hooked(server, forcing(ids(server, text))):
        r = ask(server, tools=TOOLS, max_tokens=300, parallel_tool_calls=False, stream=stream,
                **({"stream_options": {"include_usage": True}} if stream else {}))
    first_call_end = text.index("</｜DSML｜invoke>") + len("</｜DSML｜invoke>")
    used = next(n for n in range(1, 300)
                if len(server["tok"].decode(ids(server, text)[:n], skip_special_tokens=False)) >= first_call_end)
    if stream:
        assert reassembled(r) == [(CALLS[0]["function"]["name"], CALLS[0]["function"]["arguments"])]
        assert r[-2].choices[0].finish_reason == "tool_calls" and r[-1].usage.completion_tokens == used
    else:
        calls = r.choices[0].message.tool_calls
        assert [(c.function.name, c.function.arguments) for c in calls] == \
            [(CALLS[0]["function"]["name"], CALLS[0]["function"]["arguments"])]
        assert r.choices[0].finish_reason == "tool_calls" and r.usage.completion_tokens == used


# -- detokenization ---------------------------------------------------------------------------------------
@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_incremental_detokenization_equals_the_whole_decode(server):
    text = "héllo wörld 你好"
    forced = ids(server, text)
    assert len(forced) > len(text)  # multi-byte characters span several tokens
    with hooked(server, forcing(forced)):
        whole = ask(server, max_tokens=len(forced))
        chunks = ask(server, max_tokens=len(forced), stream=True)
    assert whole.choices[0].message.content == streamed_text(chunks) == server["tok"].decode(forced) == text
    assert all("\ufffd" not in (c.choices[0].delta.content or "") for c in chunks if c.choices)
    end_think = server["tok"].token_to_id("</think>")
    with hooked(server, forcing(ids(server, "思考 é") + [end_think] + forced)):
        r = ask(server, max_tokens=40, extra_body={"thinking": True})
    assert r.choices[0].message.model_extra["reasoning_content"] == "思考 é" and r.choices[0].message.content == text


# -- the real constraints (llguidance) on the model's own logits --------------------------------------
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_json_schema_output_parses_and_matches(server, stream):
    rf = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}
    r = ask(server, "Plan a trip", stream=stream, max_tokens=60, response_format=rf)
    text = "".join(c.choices[0].delta.content or "" for c in r if c.choices) if stream else r.choices[0].message.content
    value = json.loads(text)
    assert set(value) == {"city", "days"} and value["city"] in ("Paris", "Rome") and 1 <= value["days"] <= 9


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_json_object_mode_parses(server):
    """Random weights would write an endless object; a bias toward the closing brace lets the constraint
    decide everything else (the opening brace, no text before it, EOS right after)."""
    close = server["tok"].token_to_id("}")
    r = ask(server, "Answer in JSON", max_tokens=50, response_format={"type": "json_object"},
            logit_bias={str(close): 100})
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
           {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_forced_tool_choice_is_a_valid_call(server, choice):
    """Not only the call's opening: the whole call is the named tool's, its arguments valid for its schema."""
    r = ask(server, "Weather?", max_tokens=120, tools=WEATHER, tool_choice=choice)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls
    for c in calls:
        assert c.function.name in ("get_weather", "now")
        args = json.loads(c.function.arguments)
        if c.function.name == "get_weather":
            assert args["city"] in ("Paris", "Rome") and 1 <= args["days"] <= 9
    if isinstance(choice, dict):
        assert [c.function.name for c in calls] == ["get_weather"]
