"""Constrained decoding: `response_format` (JSON mode, JSON Schema) and forced DSML tool calls, on llguidance.

    factory = constraint_factory(tokenizer)             # once per server: builds the tokenizer bridge
    c = factory({"type": "json_schema", "json_schema": {"name": "x", "schema": {...}}})   # per request
    # per step:  logits = c.mask(logits); tok = pick(logits); c.advance(tok); stop when c.done()

`factory` returns None for {"type": "text"} and raises ResponseFormatError (a ValueError; `.param` is
"response_format") naming the problem, as llguidance words it. `dsml_call_constraint(name_or_None, tools,
tokenizer)` constrains a DSML tool-call block (as dsml.render_tool_calls writes it) calling the named tool,
or one or more of `tools` for "required". The rules (added tokens are markers, never text; bounded
whitespace; unimplemented keywords refused; thinking first) and why llguidance, not xgrammar:
docs/design.md ("Constrained decoding").
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import llguidance
import numpy as np
import torch

from .token_bytes import token_bytes

EOS_TOKEN = "<｜end▁of▁sentence｜>"   # DeepSeek-V4's EOS (tokenizer_config.json eos_token): id 1 in both tokenizers
END_THINK = "</think>"
DSML = "｜DSML｜"
WHITESPACE = r"[\x20\x0A\x0D\x09]{0,32}"   # one run of whitespace between JSON tokens
JSON_OBJECT = {"type": "object"}            # {"type": "json_object"}: any JSON object


class ResponseFormatError(ValueError):
    """A request's response_format (or tools, for a DSML call) cannot be enforced: a 400."""

    def __init__(self, message: str, param: str = "response_format"):
        super().__init__(message)
        self.param = param


class ConstraintError(RuntimeError):
    """The decoding loop broke the constraint (advanced a token the mask forbade) or the grammar failed."""


class _LLGuidanceTokenizer:
    """What llguidance.TokenizerWrapper reads: each id's bytes, the marker ids, EOS, and an encoder."""

    def __init__(self, tokenizer, tokens: list[bytes], special: list[int], eos_id: int):
        self.tokens, self.special_token_ids = tokens, special
        self.eos_token_id, self.bos_token_id = eos_id, None
        self._tok = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return self._tok.encode(text, add_special_tokens=False).ids


class TokenizerBridge:
    """llguidance's view of one `tokenizers.Tokenizer` (byte-level BPE). Build once: bridge_for() caches it."""

    def __init__(self, tokenizer, eos_id: int | None = None):
        if eos_id is None:
            eos_id = tokenizer.token_to_id(EOS_TOKEN)
            if eos_id is None:
                raise ValueError(f"the tokenizer has no {EOS_TOKEN!r} token: pass eos_id")
        tb = token_bytes(tokenizer)
        self.tokenizer, self.eos_id, self.vocab_size = tokenizer, int(eos_id), len(tb)
        self.tokens = tb.tokens
        self.markers = {tb.tokens[i].decode("utf-8"): i for i in sorted(tb.added)}
        view = _LLGuidanceTokenizer(tokenizer, list(tb.tokens), sorted(tb.added), self.eos_id)
        self.ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(view))
        self._grammars: dict[str, str] = {}   # request key -> checked grammar (bounded, see grammar())
        self._lock = threading.Lock()

    def marker(self, text: str) -> int:
        if text not in self.markers:
            raise ValueError(f"the tokenizer has no {text!r} token")
        return self.markers[text]

    def describe(self, token_id: int) -> str:
        return repr(self.tokens[token_id].decode("utf-8", "replace")) if 0 <= token_id < self.vocab_size else "?"

    def grammar(self, key: str, build: Callable[[], str]) -> str:
        """A checked llguidance grammar, compiled once per key (a canonical JSON of the request's part)."""
        with self._lock:
            hit = self._grammars.get(key)
        if hit is not None:
            return hit
        g = build()
        with self._lock:
            if len(self._grammars) >= 256:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[key] = g
        return g


_BRIDGES: dict[tuple[int, int | None], TokenizerBridge] = {}
_BRIDGES_LOCK = threading.Lock()


def bridge_for(tokenizer, eos_id: int | None = None) -> TokenizerBridge:
    """The cached bridge for `tokenizer` (the bridge holds the tokenizer, so its id is not reused)."""
    key = (id(tokenizer), eos_id)
    with _BRIDGES_LOCK:
        bridge = _BRIDGES.get(key)
        if bridge is None or bridge.tokenizer is not tokenizer:
            if len(_BRIDGES) >= 8:   # a server has one tokenizer; tests make a few
                _BRIDGES.pop(next(iter(_BRIDGES)))
            bridge = _BRIDGES[key] = TokenizerBridge(tokenizer, eos_id)
        return bridge


def eos_id_from_config(tokenizer_config: dict, tokenizer) -> int:
    """The EOS id named by a tokenizer_config.json (`eos_token`: a string or an AddedToken dict)."""
    eos = tokenizer_config.get("eos_token")
    text = eos.get("content") if isinstance(eos, dict) else eos
    i = tokenizer.token_to_id(text) if isinstance(text, str) else None
    if i is None:
        raise ValueError(f"tokenizer_config eos_token {eos!r} is not a token of the tokenizer")
    return i


class Constraint:
    """One request's grammar state. mask() -> pick -> advance() each step; done() when the value is complete."""

    def __init__(self, bridge: TokenizerBridge, grammar: str, what: str = "response_format"):
        self.bridge = bridge
        self._m = llguidance.LLMatcher(bridge.ll, grammar, log_level=0)
        if self._m.is_error():
            raise ResponseFormatError(f"{what}: {self._m.get_error()}", what.split(".")[0])
        self._words = np.zeros((bridge.vocab_size + 31) // 32, dtype=np.int32)
        self._allowed: np.ndarray | None = None    # bool [tokenizer vocab] for the current state
        self._blocked: dict[tuple[int, torch.device], tuple[np.ndarray, torch.Tensor]] = {}

    @property
    def vocab_size(self) -> int:
        return self.bridge.vocab_size

    def _allowed_now(self) -> np.ndarray:
        if self._allowed is None:
            if self._m.is_stopped() and not self._m.is_accepting():
                raise ConstraintError(f"the grammar stopped before the value was complete: {self._m.stop_reason()}"
                                      f" {self._m.get_error()}".rstrip())
            self._m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
            if self._m.is_error():
                raise ConstraintError(self._m.get_error())
            bits = np.unpackbits(self._words.view(np.uint8), count=self.bridge.vocab_size, bitorder="little")
            self._allowed = bits.view(np.bool_)
            self._blocked.clear()
        return self._allowed

    def allowed(self) -> torch.Tensor:
        """Which ids may come next: bool [tokenizer vocabulary] (read-only), computed once per state."""
        return torch.from_numpy(self._allowed_now())

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` [..., V] with every disallowed id at -inf (a new tensor). V may exceed the tokenizer's
        vocabulary (the model's padded embedding): the extra ids are disallowed. CPU logits are masked with
        numpy, single-threaded: torch's intra-op threads stall when a core is busy (docs/benchmarks.md)."""
        allowed = self._allowed_now()
        n = logits.shape[-1]
        key = (n, logits.device)
        if key not in self._blocked:
            blocked = np.ones(n, dtype=np.bool_)
            m = min(n, allowed.size)
            np.logical_not(allowed[:m], out=blocked[:m])
            self._blocked[key] = blocked, torch.from_numpy(blocked).to(logits.device)
        blocked_np, blocked_t = self._blocked[key]
        if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64, torch.float16):
            x = logits.detach().numpy()
            return torch.from_numpy(np.where(blocked_np, np.array(-np.inf, dtype=x.dtype), x))
        return logits.masked_fill(blocked_t, float("-inf"))

    def advance(self, token_id: int) -> None:
        """Feed the picked token. Raises ConstraintError (state unchanged) if the mask did not allow it."""
        t = int(token_id)
        if not 0 <= t < self.bridge.vocab_size or not self._allowed_now()[t]:
            raise ConstraintError(f"token {t} {self.bridge.describe(t)} is not allowed here")
        if not self._m.consume_token(t):
            raise ConstraintError(self._m.get_error())
        self._allowed = None

    def accepting(self) -> bool:
        """The text so far is a complete value (EOS is allowed now)."""
        return self._m.is_accepting()

    def done(self) -> bool:
        """The value is complete and nothing may follow but EOS (or EOS was already fed)."""
        return self._m.is_stopped() and self._m.is_accepting() and not self._m.is_error()


# ---- response_format -------------------------------------------------------------------------------------


def _schema_of(response_format) -> dict | None:
    """The JSON Schema a response_format asks for (None: plain text); ResponseFormatError when malformed."""
    if not isinstance(response_format, dict):
        raise ResponseFormatError("response_format must be an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind != "json_schema":
        raise ResponseFormatError(f"response_format.type must be 'text', 'json_object' or 'json_schema', "
                                  f"not {kind!r}")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ResponseFormatError("response_format.json_schema must be an object with 'name' and 'schema'")
    name, strict = spec.get("name"), spec.get("strict")
    if name is not None and not isinstance(name, str):
        raise ResponseFormatError("response_format.json_schema.name must be a string")
    if strict is not None and not isinstance(strict, bool):
        raise ResponseFormatError("response_format.json_schema.strict must be a boolean")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise ResponseFormatError("response_format.json_schema.schema must be a JSON Schema object, got "
                                  + ("nothing" if schema is None else type(schema).__name__))
    return schema


def _json_grammar(schema: dict, where: str, param: str = "response_format") -> str:
    """llguidance grammar for one JSON value following `schema`, checked; ResponseFormatError names the problem."""
    try:
        g = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_pattern": WHITESPACE})
    except ValueError as e:
        raise ResponseFormatError(f"{where}: {e}", param) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(g)
    if is_error:
        raise ResponseFormatError(f"{where}: {messages[0]}", param)
    return g


def _lark_json(schema: dict) -> str:
    """`%json {...}` for a Lark grammar (its whitespace rule inside, as x-guidance)."""
    return "%json " + json.dumps({**schema, "x-guidance": {"whitespace_pattern": WHITESPACE}}, ensure_ascii=False)


def _after_thinking(bridge: TokenizerBridge, body_rule: str) -> str:
    """Lark lines: reasoning text, the </think> token, then `body`."""
    return f"start: REASONING <[{bridge.marker(END_THINK)}]> body\nREASONING: /(?s:.*)/\nbody: {body_rule}\n"


def _response_format_grammar(bridge: TokenizerBridge, schema: dict, thinking: bool) -> str:
    g = _json_grammar(schema, "response_format.json_schema.schema" if schema is not JSON_OBJECT
                      else "response_format")
    if not thinking:
        return g
    return _checked_lark(bridge, _after_thinking(bridge, _lark_json(schema)), "response_format")


def _checked_lark(bridge: TokenizerBridge, lark: str, where: str) -> str:
    g = llguidance.LLMatcher.grammar_from_lark(lark)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(g, bridge.ll)
    if is_error:
        raise ResponseFormatError(f"{where}: {messages[0]}", where.split(".")[0])
    return g


def constraint_factory(tokenizer, eos_id: int | None = None):
    """factory(response_format, tokenizer=None, thinking=False) -> Constraint | None, for `tokenizer`.

    Builds (or reuses) the tokenizer bridge now, so the first request does not pay for it."""
    default = bridge_for(tokenizer, eos_id)

    def factory(response_format: dict, tokenizer=None, thinking: bool = False) -> Constraint | None:
        bridge = default if tokenizer is None or tokenizer is default.tokenizer else bridge_for(tokenizer, eos_id)
        schema = _schema_of(response_format)
        if schema is None:
            return None
        key = json.dumps({"schema": schema, "thinking": bool(thinking)}, sort_keys=True)
        grammar = bridge.grammar(key, lambda: _response_format_grammar(bridge, schema, bool(thinking)))
        return Constraint(bridge, grammar)

    factory.bridge = default
    return factory


# ---- DSML tool calls ---------------------------------------------------------------------------------------


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _types(schema: dict) -> set[str] | None:
    """The JSON types a property schema allows (None: not stated, anything)."""
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return set(t)
    if "enum" in schema and isinstance(schema["enum"], list):
        return {"string" if isinstance(v, str) else "other" for v in schema["enum"]}
    if "const" in schema:
        return {"string" if isinstance(schema["const"], str) else "other"}
    return None


def _param_rule(d: str, name: str, schema: dict, defs: dict, where: str) -> str:
    """Lark alternatives for one `<｜DSML｜parameter ...>value</｜DSML｜parameter>` line.

    A string (type "string", or a string enum/const) is raw text, string="true", as render_tool_calls
    writes it; any other type is JSON, string="false"; a schema allowing both gets both forms."""
    if not isinstance(schema, dict):
        raise ResponseFormatError(f"{where}: a property's schema must be an object", "tools")
    head = f'"<" {d} ' + _lit('parameter name="' + name + '" string=')
    close = f'{d} "parameter>\\n"'
    types = _types(schema)
    forms = []
    if types is None or "string" in types:
        values = schema.get("enum", [schema["const"]] if "const" in schema else None)
        strings = [v for v in values if isinstance(v, str)] if isinstance(values, list) else None
        if strings:   # the listed strings, then the closing "</"
            forms.append(f'{head} "\\"true\\">" ({" | ".join(_lit(s + "</") for s in strings)}) {close}')
        else:         # any text (within min/maxLength), then the closing "</" + DSML token (never text)
            lo, hi = schema.get("minLength", 0), schema.get("maxLength")
            if not isinstance(lo, int) or lo < 0 or not (hi is None or (isinstance(hi, int) and hi >= lo)):
                raise ResponseFormatError(f"{where}: minLength/maxLength must be integers, min <= max", "tools")
            value = "RAW_VALUE" if (lo, hi) == (0, None) else f"/(?s:.{{{lo},{'' if hi is None else hi}}})<\\//"
            forms.append(f'{head} "\\"true\\">" {value} {close}')
    if types != {"string"}:
        sub = dict(schema, **({"$defs": defs} if defs else {}))
        _json_grammar(sub, where, "tools")   # a clear error for a bad property schema
        forms.append(f'{head} "\\"false\\">" {_lark_json(sub)} "</" {close}')
    return " | ".join(f"({f})" for f in forms)


def _invoke_rules(d: str, tool: dict, index: int) -> tuple[str, list[str]]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    where = f"tools[{index}].function"
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ResponseFormatError(f"{where}.name must be a non-empty string", "tools")
    name = fn["name"]
    if any(c in name for c in '"<>'):
        raise ResponseFormatError(f"{where}.name {name!r} cannot be written in DSML (it has \", < or >)", "tools")
    params = fn.get("parameters") or {}
    if not isinstance(params, dict):
        raise ResponseFormatError(f"{where}.parameters must be a JSON Schema object", "tools")
    props = params.get("properties") or {}
    required = params.get("required") or []
    if not isinstance(props, dict) or not isinstance(required, list):
        raise ResponseFormatError(f"{where}.parameters: properties must be an object and required a list", "tools")
    missing = [r for r in required if r not in props]
    if missing:
        raise ResponseFormatError(f"{where}.parameters: required {missing} not in properties", "tools")
    defs = params.get("$defs") or params.get("definitions") or {}
    rules, seq = [], []
    for j, (pname, pschema) in enumerate(props.items()):
        if any(c in pname for c in '"<>'):
            raise ResponseFormatError(f"{where}.parameters: property name {pname!r} cannot be written in DSML",
                                      "tools")
        rule = f"p{index}_{j}"
        rules.append(f"{rule}: {_param_rule(d, pname, pschema, defs, f'{where}.parameters.properties.{pname}')}")
        seq.append(rule if pname in required else f"{rule}?")
    # parameters in the schema's order: the required ones always, the others optional
    rules.append(f'invoke{index}: "<" {d} ' + _lit('invoke name="' + name + '">\n')
                 + f' {" ".join(seq)} "</" {d} "invoke>\\n"')
    return name, rules


def dsml_call_constraint(tool_name: str | None, tools: list[dict], tokenizer, eos_id: int | None = None,
                         thinking: bool = False) -> Constraint:
    """A Constraint whose text is a DSML tool-call block, as dsml.render_tool_calls writes it
    ("\\n\\n" + `<｜DSML｜tool_calls>` ... `</｜DSML｜tool_calls>`), then EOS.

    tool_name: tool_choice {"type": "function", "function": {"name": ...}}: exactly one call of it;
    None: tool_choice "required": one or more calls, each of any tool. Parameters follow each tool's
    JSON Schema: in `properties` order, required ones present, strings raw (string="true"), other types
    JSON (string="false") valid against the property's schema. Raises ResponseFormatError (param
    "tools" or "tool_choice") naming a problem."""
    bridge = bridge_for(tokenizer, eos_id)
    if not isinstance(tools, list) or not tools:
        raise ResponseFormatError("tools must be a non-empty list for a forced tool call", "tools")
    key = json.dumps({"dsml": tool_name, "tools": tools, "thinking": bool(thinking)}, sort_keys=True, default=str)

    def build() -> str:
        d = f"<[{bridge.marker(DSML)}]>"
        rules, names = [], []
        for i, tool in enumerate(tools):
            name, r = _invoke_rules(d, tool, i)
            names.append(name)
            rules += r
        if tool_name is None:
            calls = "(" + " | ".join(f"invoke{i}" for i in range(len(tools))) + ")+"
        elif tool_name in names:
            calls = f"invoke{names.index(tool_name)}"
        else:
            raise ResponseFormatError(f"tool_choice names {tool_name!r}, which is not among the tools", "tool_choice")
        body = f'"\\n\\n<" {d} "tool_calls>\\n" {calls} "</" {d} "tool_calls>"'
        head = _after_thinking(bridge, body) if thinking else f"start: {body}\n"
        lark = head + "RAW_VALUE: /(?s:.*)<\\//\n" + "\n".join(rules) + "\n"
        return _checked_lark(bridge, lark, "tools")

    return Constraint(bridge, bridge.grammar(key, build), "tools")
