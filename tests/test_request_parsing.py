"""Each endpoint parses its body once into its typed model (server/openai_api/, server/anthropic_api/): the
handlers read typed attributes, the checks bound by the server (its model's name, the vocabulary) come from
the context check() is given, and a request with several faults gets the one the server always reported
first (RequestModel.check_order). The server tests (test_server_fields.py, test_messages_*.py) show every
single fault's 400 through the real server."""

import time

import httpx
import pytest

from ostinato.server.anthropic_api import CountTokensRequest, MessagesRequest
from ostinato.server.anthropic_api.parts import TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock
from ostinato.server.errors import APIError
from ostinato.server.events import POLL_S
from ostinato.server.fields import RequestModel
from ostinato.server.messages_request import chat_request
from ostinato.server.openai_api import ChatCompletionRequest, CompletionRequest
from ostinato.server.sampling import Sampling

SERVER = {"model": "tiny", "vocab": 1024}
USER = [{"role": "user", "content": "hi"}]
MODELS = (ChatCompletionRequest, CompletionRequest, MessagesRequest, CountTokensRequest)


def refusal(model, body, context=SERVER) -> APIError:
    with pytest.raises(APIError) as e:
        model.check(body, context=context)
    return e.value


def test_completions_parse_into_typed_values():
    req = CompletionRequest.check({"model": "tiny", "prompt": [[5, 6]], "temperature": 1, "top_p": 0.5, "seed": 7,
                                   "logit_bias": {"3": -1}, "stop": ["a", "b", "a"], "logprobs": 2, "stream": True,
                                   "stream_options": {"include_usage": True}, "max_tokens": 9}, context=SERVER)
    assert req.prompt == [5, 6]  # a batch of one prompt is that prompt
    assert req.stops == ("a", "b") and req.include_usage and req.asked_tokens() == 9
    assert req.sampling((4,)) == Sampling(temperature=1.0, top_p=0.5, seed=7, logit_bias=((3, -1.0),), banned=(4,),
                                          logprobs=True, top_logprobs=2)
    assert CompletionRequest.check({"model": "tiny", "prompt": "x"}, context=SERVER).sampling() == Sampling()


@pytest.mark.parametrize("body, thinking, effort", [
    ({}, False, None), ({"reasoning_effort": "high"}, True, "high"), ({"reasoning_effort": "none"}, False, None),
    ({"reasoning_effort": "none", "thinking": "ignored"}, False, None), ({"thinking": {"type": "enabled"}}, True, None),
    ({"reasoning_effort": "max", "thinking": False}, False, "max"), ({"reasoning_effort": None}, False, None),
])
def test_chat_thinking_and_effort(body, thinking, effort):
    req = ChatCompletionRequest.check({"model": "tiny", "messages": USER, **body}, context=SERVER)
    assert (req.thinking_mode, req.effort) == (thinking, effort)


def test_chat_parses_into_typed_values():
    req = ChatCompletionRequest.check({"model": "tiny", "messages": USER, "max_tokens": 5, "max_completion_tokens": 3,
                                       "logprobs": True, "top_logprobs": 2, "parallel_tool_calls": None,
                                       "tools": None}, context=SERVER)
    assert req.asked_tokens() == 3 and req.parallel_tool_calls is True and req.tools == []
    assert req.sampling().logprobs and req.sampling().top_logprobs == 2


def test_max_tokens_is_not_read_beside_max_completion_tokens():
    """As before the typed models: max_completion_tokens first, max_tokens read (and checked) only without it."""
    req = ChatCompletionRequest.check({"model": "tiny", "messages": USER, "max_completion_tokens": 3,
                                       "max_tokens": "many"}, context=SERVER)
    assert req.asked_tokens() == 3
    assert refusal(ChatCompletionRequest, {"model": "tiny", "messages": USER, "max_completion_tokens": None,
                                           "max_tokens": "many"}).param == "max_tokens"
    assert refusal(ChatCompletionRequest, {"model": "tiny", "messages": USER, "max_completion_tokens": 0,
                                           "max_tokens": "many"}).param == "max_completion_tokens"


def test_messages_parse_into_typed_blocks():
    body = {"model": "tiny", "max_tokens": 50, "system": [{"type": "text", "text": "Be brief."}],
            "thinking": {"type": "enabled", "budget_tokens": 20}, "top_k": 3, "stop_sequences": ["x", "x"],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "f"},
            "messages": [{"role": "user", "content": "a"},
                         {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"},
                                                           {"type": "tool_use", "id": "u", "name": "f", "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u", "is_error": True,
                                                       "content": [{"type": "text", "text": "no"}]},
                                                      {"type": "text", "text": "b"}]}]}
    req = MessagesRequest.check(body, context=SERVER)
    assert req.system == "Be brief." and req.think_budget == 20 and req.stop_sequences == ("x",)
    assert [type(b) for m in req.messages for b in m.content] == [TextBlock, ThinkingBlock, ToolUseBlock,
                                                                  ToolResultBlock, TextBlock]
    assert req.messages[2].content[0].content == "no"  # a tool_result's text blocks, read
    assert req.tool_choice.name == "f" and req.tools[0].input_schema == {"type": "object"}
    assert req.sampling() == Sampling(top_k=3)
    chat = chat_request(req)
    assert chat.tool_choice == {"type": "function", "function": {"name": "f"}} and chat.think_budget == 20
    assert chat.messages[3] == {"role": "tool", "tool_call_id": "u", "content": "Error: no"}


@pytest.mark.parametrize("model, body", [
    (ChatCompletionRequest, {"messages": USER}), (CompletionRequest, {"prompt": "x"}),
    (MessagesRequest, {"max_tokens": 4, "messages": USER}), (CountTokensRequest, {"messages": USER}),
])
def test_the_model_is_the_servers_or_a_404(model, body):
    e = refusal(model, {**body, "model": "gpt-9"})
    assert (e.status, e.param, e.code) == (404, "model", "model_not_found")
    assert e.message == "model 'gpt-9' does not exist; this server has 'tiny'"
    assert refusal(model, body).status == 404  # no model at all
    model.check({**body, "model": "anything"})  # no server context: not checked


def test_the_vocabulary_bounds_token_ids_where_the_server_gives_it():
    e = refusal(ChatCompletionRequest, {"model": "tiny", "messages": USER, "logit_bias": {"1024": 1}})
    assert e.message == "logit_bias key '1024' is not a token id in [0, 1024)"
    assert refusal(CompletionRequest, {"model": "tiny", "prompt": [1023, 1024]}).message == \
        "prompt token ids must be in [0, 1024); got [1024]"
    e = refusal(MessagesRequest, {"model": "tiny", "max_tokens": 4, "messages": USER, "top_k": 1025})
    assert e.message == "top_k must be an integer in [1, 1024], got 1025"
    assert ChatCompletionRequest.check({"messages": USER, "logit_bias": {"1024": 1}}).logit_bias == ((1024, 1.0),)


@pytest.mark.parametrize("model, body, param", [
    # the server's order: a field's type and unknown fields, then refused values, bookkeeping, the model, the rest
    (ChatCompletionRequest, {"frobnicate": 1, "temperature": 9}, "frobnicate"),
    (ChatCompletionRequest, {"verbosity": 5, "audio": {}}, "verbosity"),
    (ChatCompletionRequest, {"audio": {}, "stream": "yes"}, "audio"),
    (ChatCompletionRequest, {"stream": "yes", "model": "gpt-9"}, "stream"),
    (ChatCompletionRequest, {"model": "gpt-9", "temperature": 9, "tools": 5}, "model"),
    (ChatCompletionRequest, {"temperature": 9, "n": 2}, "n"),
    (ChatCompletionRequest, {"max_tokens": 0, "stop": 5}, "stop"),
    (CompletionRequest, {"max_tokens": 0, "return_token_ids": "y", "prompt": None}, "prompt"),
    (CompletionRequest, {"best_of": 2, "prompt": None, "model": "gpt-9"}, "best_of"),
    (MessagesRequest, {"model": "gpt-9", "temperature": 5, "stop_sequences": 5}, "stop_sequences"),
    (MessagesRequest, {"max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 10}, "system": 5,
                       "stop_sequences": [""]}, "system"),
    (MessagesRequest, {"max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 10}, "stop_sequences": [""]},
     "thinking.budget_tokens"),
    (MessagesRequest, {"container": "c", "metadata": 5, "max_tokens": None}, "container"),
])
def test_several_faults_give_the_one_reported_first_before(model, body, param):
    base = {"model": "tiny", **({"prompt": "x"} if model is CompletionRequest else {"messages": USER})}
    if model is MessagesRequest:
        base["max_tokens"] = 4
    assert refusal(model, {**base, **body}).param == param


@pytest.mark.parametrize("model", MODELS)
def test_check_order_and_refusals_name_fields_of_the_model(model: type[RequestModel]):
    """A misspelt name in check_order or refusals would silently rank or refuse nothing."""
    assert set(model.check_order) <= set(model.model_fields)
    assert set(model.refusals) <= set(model.model_fields)
    assert len(set(model.check_order)) == len(model.check_order)


# -- through the real server: a reply slower than the handlers' connection poll --------------------------------
class SlowScript:
    """Forces `tokens` then EOS, each step sleeping past events.POLL_S, so that a waiting handler polls its
    connection (the Starlette request, not the parsed body) between tokens."""

    def __init__(self, tokens):
        self.tokens = tokens

    def __call__(self, gen, logits):
        time.sleep(POLL_S * 1.5)
        out = logits.clone().fill_(float("-inf"))
        out[self.tokens[len(gen)] if len(gen) < len(self.tokens) else 1] = 0.0
        return out


@pytest.mark.slow  # the server on a compiled plan (C++ kernels)
def test_each_endpoint_answers_a_reply_slower_than_its_connection_poll(tiny_ckpt, tmp_path, kernel_dir):
    from server_helpers import tiny_server

    script = SlowScript([])
    srv, base, _, _, tok = tiny_server(tiny_ckpt, tmp_path, kernel_dir, script, {"speculative": "off"})
    try:
        script.tokens = tok.encode("Hello there", add_special_tokens=False).ids
        url = base.removesuffix("/v1")
        got = {
            "chat": httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": "tiny", "messages": USER, "max_tokens": 8}).json()["choices"][0]["message"]["content"],
            "completions": httpx.post(f"{url}/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": "x", "max_tokens": 8}).json()["choices"][0]["text"],
            "messages": httpx.post(f"{url}/v1/messages", timeout=60, json={
                "model": "tiny", "messages": USER, "max_tokens": 8}).json()["content"][0]["text"],
        }
        eos = tok.decode([1], skip_special_tokens=False)  # a completion's text keeps special tokens
        assert got == {"chat": "Hello there", "completions": "Hello there" + eos, "messages": "Hello there"}
    finally:
        srv.should_exit = True
