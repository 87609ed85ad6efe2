"""DSML tool calls: parse, render back, and the streaming parser over any chunk split."""

import json
import random

import pytest

from ostinato.runtime.server.dsml import (DSMLError, StreamParser, parse_block, render_tool_calls,
                                          split_tool_calls)

D = "｜DSML｜"
BLOCK = (f'<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
         f'<{D}parameter name="city" string="true">Paris, "FR"</{D}parameter>\n'
         f'<{D}parameter name="days" string="false">3</{D}parameter>\n'
         f'<{D}parameter name="opts" string="false">{{"unit": "C", "hourly": [1, 2]}}</{D}parameter>\n'
         f'</{D}invoke>\n<{D}invoke name="now">\n</{D}invoke>\n</{D}tool_calls>')
TEXT = "Let me check.\n\n" + BLOCK


def test_parse_well_formed():
    content, calls = split_tool_calls(TEXT)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0].arguments) == {"city": 'Paris, "FR"', "days": 3, "opts": {"unit": "C", "hourly": [1, 2]}}
    assert json.loads(calls[1].arguments) == {}
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id


def test_render_round_trip():
    _, calls = split_tool_calls(TEXT)
    text = render_tool_calls([c.to_openai() for c in calls])
    assert text == "\n\n" + BLOCK
    assert [(c.name, c.arguments) for c in split_tool_calls(text)[1]] == [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("bad, why", [
    (BLOCK.replace('string="false">3<', 'string="false">three<'), "not JSON"),
    (BLOCK.replace(f"</{D}invoke>\n<{D}invoke", f"</{D}invoke>\nstray<{D}invoke"), "unexpected text"),
    (f"<{D}tool_calls>\n</{D}tool_calls>", "without any invoke"),
    (BLOCK.replace('name="days"', 'name="city"'), "given twice"),
])
def test_malformed_raises_and_stays_content(bad, why):
    with pytest.raises(DSMLError, match=why):
        parse_block(bad)
    assert split_tool_calls("x\n\n" + bad) == ("x\n\n" + bad, [])


def test_unterminated_block_is_content():
    text = TEXT[:-5]
    assert split_tool_calls(text) == (text, [])


def _stream(text, seed):
    rng, p, out, pos = random.Random(seed), StreamParser(), [], 0
    while pos < len(text):
        n = rng.randint(1, 7)
        out += p.feed(text[pos:pos + n])
        pos += n
    return out + p.finish()


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("text", [TEXT, "no calls here\n\n<｜DSML｜", TEXT[:-3], "x\n\n" + BLOCK.replace("3<", "z<")])
def test_streaming_equals_whole_parse(text, seed):
    events = _stream(text, seed)
    content = "".join(v for k, v in events if k == "content")
    calls = [c for k, v in events if k == "tool_calls" for c in v]
    want_content, want_calls = split_tool_calls(text)
    assert content == want_content
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in want_calls]
    assert all(k == "tool_calls" for k, _ in events[len(events) - bool(calls):])  # calls come last
