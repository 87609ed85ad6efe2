"""A JSON object cut short: the arguments of a tool call cut off by max_tokens, parsed as far as they go.

A call cut off mid-way is returned as generated (dsml_stream.py): OpenAI's `arguments` are then the start
of a JSON object ('{"city": "Par'), Anthropic's whole `input` that start closed into an object. The
server must take back what it returned, so both read it with the same rule:

    object_prefix('{"city": "Par')     -> {"city": "Par"}     the string closed where it was cut
    object_prefix('{"n": 12, "unit')   -> {"n": 12}           a cut key (or literal, or comma) dropped
    object_prefix('{"a": 1} tail')     -> None                not the start of any JSON object
"""

from __future__ import annotations

import json
import re

CLOSERS = {"{": "}", "[": "]"}
# What may follow the last value that closes: a comma, a key (whole or cut, with its colon), and a literal,
# number or escape cut short. Anything else means the text is not the start of a JSON object.
_CUT_TAIL = re.compile(r'\s*,?\s*(?:"(?:[^"\\]|\\.)*\\?(?:"\s*:?)?)?\s*'
                       r'(?:[0-9.eE+-]+|t|tr|tru|f|fa|fal|fals|n|nu|nul|\\(?:u[0-9a-fA-F]{0,3})?)?\s*')
TRIES = 256   # how far back from the end a cut key or literal is looked for


def _states(text: str, start: int):
    """(position, closing text) for each position from `start` on: what closes text[:position], or None
    where it cannot be closed (mid-escape, or more closers than openers)."""
    stack, in_string, escaped, broken = [], False, False, False
    for pos in range(len(text) + 1):
        if pos >= start:
            yield pos, None if broken or (in_string and escaped) else ('"' if in_string else "") + "".join(
                reversed(stack))
        if pos == len(text):
            return
        ch = text[pos]
        if in_string:
            if ch == '"' and not escaped:
                in_string = False
            escaped = not escaped and ch == "\\"
        elif ch == '"':
            in_string, escaped = True, False
        elif ch in CLOSERS:
            stack.append(CLOSERS[ch])
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                broken = True


def object_prefix(text: str) -> dict | None:
    """The object a complete or cut-off JSON object text holds so far, or None when `text` is neither."""
    try:
        value = json.loads(text)
        return value if isinstance(value, dict) else None
    except json.JSONDecodeError:
        pass
    if not text.lstrip().startswith("{"):
        return None
    closings = dict(_states(text, max(0, len(text) - TRIES)))
    for end in range(len(text), max(0, len(text) - TRIES) - 1, -1):
        if end and text[end - 1] in " \t\r\n,:" or closings[end] is None:
            continue  # the shorter candidate (those characters stripped) is tried next
        if not _CUT_TAIL.fullmatch(text, end):
            continue  # what this candidate drops is not a cut key, literal or comma
        try:
            value = json.loads(text[:end] + closings[end])
        except json.JSONDecodeError:
            continue
        return value if isinstance(value, dict) else None
    return None


def partial_object(text: str) -> dict:
    """object_prefix, {} when nothing closes into an object (the Messages API's whole input of a cut call)."""
    value = object_prefix(text)
    return {} if value is None else value
