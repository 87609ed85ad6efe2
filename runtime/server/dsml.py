"""DeepSeek-V4 tool calls (DSML): parse the model's text into OpenAI tool_calls, render them back.

The format (docs/model.md section 5; `｜DSML｜` is one token), preceded by "\\n\\n" in an assistant turn:

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="ARG" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="N" string="false">42</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

string="true" values are raw text; string="false" values are JSON. `parse_block` raises DSMLError
(naming what is wrong) on a malformed block; the callers (`split_tool_calls`, `StreamParser`) then
return the whole text as plain content, so a malformed call never fails a request and never loses text.
Rendering writes str values with string="true" and everything else as JSON, so parse(render(c)) == c.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

DSML = "｜DSML｜"
BLOCK_START = f"<{DSML}tool_calls>"
BLOCK_END = f"</{DSML}tool_calls>"
SEPARATOR = "\n\n"  # between content and the block

_INVOKE = re.compile(rf'<{DSML}invoke name="([^"<>]+)">(.*?)</{DSML}invoke>', re.S)
_PARAM = re.compile(rf'<{DSML}parameter name="([^"<>]+)" string="(true|false)">(.*?)</{DSML}parameter>', re.S)


class DSMLError(ValueError):
    pass


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = ""

    def to_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _only_space(text: str, where: str) -> None:
    if text.strip():
        raise DSMLError(f"unexpected text {text.strip()[:40]!r} {where}")


def parse_block(block: str) -> list[ToolCall]:
    """One `<｜DSML｜tool_calls>...</｜DSML｜tool_calls>` block (surrounding whitespace allowed)."""
    body = block.strip()
    if not body.startswith(BLOCK_START) or not body.endswith(BLOCK_END):
        raise DSMLError(f"a tool-call block must start with {BLOCK_START} and end with {BLOCK_END}")
    body = body[len(BLOCK_START):-len(BLOCK_END)]
    calls, pos = [], 0
    for m in _INVOKE.finditer(body):
        _only_space(body[pos:m.start()], "between invokes")
        pos = m.end()
        args, ppos = {}, 0
        for p in _PARAM.finditer(m.group(2)):
            _only_space(m.group(2)[ppos:p.start()], f"in invoke {m.group(1)!r}")
            ppos = p.end()
            name, is_string, raw = p.group(1), p.group(2) == "true", p.group(3)
            if name in args:
                raise DSMLError(f"invoke {m.group(1)!r}: parameter {name!r} given twice")
            if is_string:
                args[name] = raw
            else:
                try:
                    args[name] = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise DSMLError(f"invoke {m.group(1)!r}: parameter {name!r} has string=\"false\" but its "
                                    f"value is not JSON ({e.msg})") from None
        _only_space(m.group(2)[ppos:], f"in invoke {m.group(1)!r}")
        calls.append(ToolCall(m.group(1), json.dumps(args, ensure_ascii=False), new_call_id()))
    _only_space(body[pos:], "after the last invoke")
    if not calls:
        raise DSMLError("a tool-call block without any invoke")
    return calls


def split_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a finished reply; a malformed or unterminated block stays plain content."""
    start = text.find(BLOCK_START)
    if start < 0:
        return text, []
    end = text.find(BLOCK_END, start)
    if end < 0 or text[end + len(BLOCK_END):].strip():
        return text, []
    try:
        calls = parse_block(text[start:end + len(BLOCK_END)])
    except DSMLError:
        return text, []
    content = text[:start]
    return (content[:-len(SEPARATOR)] if content.endswith(SEPARATOR) else content), calls


def render_tool_calls(calls: list[dict]) -> str:
    """OpenAI tool_calls (dicts with function.name and function.arguments) as DSML, separator included."""
    lines = [BLOCK_START]
    for i, c in enumerate(calls):
        fn = c.get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise DSMLError(f"tool_calls[{i}].function.name must be a non-empty string")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            raise DSMLError(f"tool_calls[{i}].function.arguments is not JSON") from None
        if not isinstance(args, dict):
            raise DSMLError(f"tool_calls[{i}].function.arguments must be a JSON object")
        lines.append(f'<{DSML}invoke name="{name}">')
        for k, v in args.items():
            if isinstance(v, str):
                lines.append(f'<{DSML}parameter name="{k}" string="true">{v}</{DSML}parameter>')
            else:
                lines.append(f'<{DSML}parameter name="{k}" string="false">'
                             f'{json.dumps(v, ensure_ascii=False)}</{DSML}parameter>')
        lines.append(f"</{DSML}invoke>")
    lines.append(BLOCK_END)
    return SEPARATOR + "\n".join(lines)


def _held_back(buf: str) -> int:
    """How many trailing characters of buf could begin the separator + block start."""
    marker = SEPARATOR + BLOCK_START
    for n in range(min(len(buf), len(marker)), 0, -1):
        if marker.startswith(buf[-n:]) or BLOCK_START.startswith(buf[-n:]):
            return n
    return 0


class StreamParser:
    """Incremental: feed text deltas, get ("content", str) and ("tool_calls", [ToolCall]) events.

    Content flows out until a block may be starting (a suffix that could begin it is held back);
    the block is buffered and parsed when it closes. At `finish()`, an unterminated or malformed
    block (or text after it) comes out as content, exactly as `split_tool_calls` would return it.
    """

    def __init__(self):
        self.buf, self.in_block, self.calls = "", False, []

    def feed(self, delta: str) -> list[tuple[str, object]]:
        self.buf += delta
        out = []
        if not self.in_block:
            start = self.buf.find(BLOCK_START)
            if start < 0:
                keep = _held_back(self.buf)
                emit, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                return [("content", emit)] if emit else []
            pre = self.buf[:start]
            pre = pre[:-len(SEPARATOR)] if pre.endswith(SEPARATOR) else pre
            self.pending_sep = self.buf[len(pre):start]  # kept to restore the text if the block is malformed
            if pre:
                out.append(("content", pre))
            self.buf, self.in_block = self.buf[start:], True
        if self.in_block and not self.calls:
            end = self.buf.find(BLOCK_END)
            if end >= 0:
                try:
                    self.calls = parse_block(self.buf[:end + len(BLOCK_END)])
                    self.rest = self.buf[end + len(BLOCK_END):]
                except DSMLError:
                    return out  # released as content at finish()
        return out

    def finish(self) -> list[tuple[str, object]]:
        if self.in_block and self.calls and not (self.buf[self.buf.find(BLOCK_END) + len(BLOCK_END):]).strip():
            return [("tool_calls", self.calls)]
        text = (self.pending_sep if self.in_block else "") + self.buf
        return [("content", text)] if text else []
