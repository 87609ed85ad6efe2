"""tool_choice in OpenAI's shape (the Messages API's is translated to it, messages_request.py): what the
sampler must ban, what call it must force, and whether the reply's tool calls are parsed."""

from __future__ import annotations

import json

from .dsml import DSML
from .errors import APIError

REQUIRED = ""  # tool_choice's `force` for tool_choice "required": a call of any of the tools


def tool_choice(tc, tools: list, tok) -> tuple[tuple[int, ...], str | None, bool]:
    """(banned, force, parse_tools) for a request's tool_choice `tc`; force: None, REQUIRED or a tool's name."""
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    if tc in (None, "auto"):
        return (), None, bool(tools)
    if tc == "none":  # tools stay in the prompt (a stable prefix); the model just cannot start a call
        return (tok.token_to_id(DSML),), None, False
    if tc == "required" and tools:
        return (), REQUIRED, True
    if isinstance(tc, dict) and tc.get("type") == "function" and isinstance(tc.get("function"), dict):
        name = tc["function"].get("name")
        if name not in names:
            raise APIError(400, f"tool_choice names function {name!r}, which is not among the tools "
                                f"({', '.join(map(str, names)) or 'none given'})", "tool_choice")
        return (), name, True
    raise APIError(400, f"tool_choice must be 'auto', 'none', 'required' (with tools) or "
                        f"{{'type': 'function', 'function': {{'name': ...}}}}; got {json.dumps(tc)[:80]}",
                   "tool_choice")
