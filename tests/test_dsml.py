"""DSML tool calls: parse, render back, and the streaming parser over any chunk split."""

import json
import random

import pytest

from ostinato.server.dsml import (
    BLOCK_START,
    DSML,
    SEPARATOR,
    DSMLError,
    parse_block,
    render_tool_calls,
    split_tool_calls,
)
from ostinato.server.dsml_stream import ToolCallStream

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


def _stream(text, seed, max_calls=None):
    rng, p, out, pos = random.Random(seed), ToolCallStream(max_calls), [], 0
    while pos < len(text):
        n = rng.randint(1, 7)
        out += p.feed(text[pos:pos + n])
        pos += n
    return out + p.finish(), p


def _reassembled(events) -> list[tuple[str, str]]:
    """(name, arguments) per call from streamed deltas, as an OpenAI client accumulates them."""
    calls = {}
    for kind, d in events:
        if kind == "tool_call":
            if "id" in d:
                assert d["type"] == "function" and d["function"]["arguments"] == "" and d["index"] == len(calls)
                calls[d["index"]] = [d["function"]["name"], ""]
            else:
                calls[d["index"]][1] += d["function"]["arguments"]
    return [tuple(c) for c in calls.values()]


STRINGY = BLOCK.replace('Paris, "FR"', 'Paris, "FR"\n 你好 \\ é\t<b>')


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("text", [TEXT, "x\n\n" + STRINGY, "no calls here\n\n<｜DSML｜", "a\n\nb", TEXT[:-3],
                                  f"x\n\n<{D}tool_calls>\n</{D}tool_calls>", f"x\n\n<{D}tool_calls>\nnope"])
def test_streaming_equals_whole_parse(text, seed):
    """Streamed in any split: the content and the calls (reassembled from their deltas) of the whole parse;
    a block that fails before its first call is content; one cut off after it keeps its calls as sent."""
    events, p = _stream(text, seed)
    content = "".join(v for k, v in events if k == "content")
    want_content, want_calls = split_tool_calls(text)
    if text == TEXT[:-3]:  # cut off inside the closing tag: both calls are complete, nothing is content
        want_content, want_calls = split_tool_calls(TEXT)
    if text.endswith(f"<{D}"):  # a block's opening the model cut short: markup, never content
        want_content = text[:text.index("\n\n<")]
    assert content == want_content
    assert _reassembled(events) == [(c.name, c.arguments) for c in p.calls] == \
        [(c.name, c.arguments) for c in want_calls]
    assert p.closed == (text in (TEXT, "x\n\n" + STRINGY))


@pytest.mark.parametrize("seed", range(5))
def test_streaming_fault_after_a_call_keeps_it(seed):
    text = "x\n\n" + BLOCK.replace("3<", "z<")  # the second parameter's JSON is bad
    events, p = _stream(text, seed)
    assert [c.name for c in p.calls] == ["get_weather"]
    assert p.calls[0].arguments == '{"city": "Paris, \\"FR\\""'  # as sent; the cut-off call is not closed
    assert "".join(v for k, v in events if k == "content") == "x" + text[text.index("z</"):]


@pytest.mark.parametrize("seed", range(5))
def test_streaming_max_calls_closes_after_the_first(seed):
    events, p = _stream(TEXT, seed, max_calls=1)
    assert p.closed and [c.name for c in p.calls] == ["get_weather"]
    assert _reassembled(events) == [(c.name, c.arguments) for c in split_tool_calls(TEXT)[1][:1]]
    assert "".join(v for k, v in events if k == "content") == "Let me check."


@pytest.mark.parametrize("generated, arguments", [
    (f'{BLOCK_START}\n<{DSML}invoke name="f">\n<{DSML}parameter name="n" string="false">[1, 2', '{"n": [1, 2'),
    (f'{BLOCK_START}\n<{DSML}invoke name="f">\n<{DSML}parameter name="s" string="true">Par</{DSML}para',
     '{"s": "Par'),
    (f'{BLOCK_START}\n<{DSML}invoke name="f">\n', "{"),
])
def test_a_call_cut_off_keeps_its_arguments_as_generated(generated, arguments):
    """max_tokens mid-call: the arguments as far as they got (unfinished JSON, as OpenAI returns), never ""."""
    s = ToolCallStream()
    s.feed(SEPARATOR + generated)
    s.finish()
    assert [(c.name, c.arguments) for c in s.calls] == [("f", arguments)]


CALL_BLOCK = SEPARATOR + f'{BLOCK_START}\n<{DSML}invoke name="get_weather">\n'


@pytest.mark.parametrize("cut", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_a_block_cut_before_its_first_call_is_nothing(cut, seed):
    """Every prefix of a block up to its first call's complete name (a forced call cut by max_tokens, or the
    model ending there): no call and no markup in the content, whatever the split; the text before stays.
    The old parser returned the block's opening as content."""
    end = CALL_BLOCK.index('">')  # the name is complete, and the call begins, with the '">' after it
    for n in range(1, end + 2):
        rng, p, events, pos = random.Random(seed * 1000 + n), ToolCallStream(), [], 0
        text = "Sure." + CALL_BLOCK[:n]
        while pos < len(text):
            k = rng.randint(1, 7)
            events += p.feed(text[pos:pos + k])
            pos += k
        events += p.finish(cut)
        content = "".join(v for k, v in events if k == "content")
        # a cut reply also drops the held-back whitespace that could begin the block; an ended one keeps it
        want = "Sure." + ("" if cut or DSML in CALL_BLOCK[:n] else CALL_BLOCK[:n])
        assert content == want, (n, content)
        assert p.calls == [] and not [e for e in events if e[0] == "tool_call"]
    p = ToolCallStream()  # one character more: '">' closes the name, the call begins
    events = p.feed("Sure." + CALL_BLOCK) + p.finish(cut)
    assert [(c.name, c.arguments) for c in p.calls] == [("get_weather", "{")]


@pytest.mark.parametrize("text, cut, want", [
    ("Hello\n", True, "Hello"), ("Hello\n", False, "Hello\n"), ("a <", True, "a "), ("a <", False, "a <"),
    ("a\n\n<", True, "a"), ("a\n\n<", False, "a\n\n<"), (f"a\n\n<{DSML}tool", False, "a"),
    ("a < b", True, "a < b"),
])
def test_a_cut_reply_never_ends_in_the_start_of_markup(text, cut, want):
    """What the parser held back as a possible block start: text when the model ended the reply (unless it
    holds the DSML token), dropped when max_tokens cut it (it was, as far as anyone can tell, a call's start)."""
    p = ToolCallStream()
    events = p.feed(text) + p.finish(cut)
    assert "".join(v for k, v in events if k == "content") == want
