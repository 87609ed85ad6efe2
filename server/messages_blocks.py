"""A reply as the Messages API's content blocks: reply.py's events (reasoning, content, OpenAI tool-call
deltas) in, Anthropic's stream events and the whole message's `content` out, from one class so that a
streamed and a whole reply always agree.

    blocks = ContentBlocks()
    events = blocks.feed(reply_events)    # [content_block_start | content_block_delta | content_block_stop]
    events += blocks.close()
    blocks.content                        # [{"type": "thinking" | "text" | "tool_use", ...}], the whole reply

Reasoning is a `thinking` block (thinking_delta), content a `text` block (text_delta), each call a
`tool_use` block whose input streams as input_json_delta pieces: the same pieces as the OpenAI path's
arguments, which concatenate to the call's JSON. A call cut off by max_tokens keeps what was generated:
streamed, the pieces as they came (the client's partial-JSON parser reads them, as it does Anthropic's);
whole, the input parsed from that unfinished JSON as far as it goes (partial_json.py), which is also how the
server reads such a call sent back as OpenAI arguments: either API's history renders the same call.
"""

from __future__ import annotations

from .partial_json import partial_object


def tool_use_id(call_id: str) -> str:
    """The reply's call id in Anthropic's style (the id is not part of the prompt: any form round-trips)."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(reply, reason: str) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from a ReplyBuilder and the worker's reason ("stop", "length")."""
    if reply.stop_sequence is not None:
        return "stop_sequence", reply.stop_sequence
    if reason == "length":
        return "max_tokens", None
    return ("tool_use" if reply.tool_calls else "end_turn"), None


class ContentBlocks:
    def __init__(self):
        self.content: list[dict] = []    # the blocks so far, as the whole message gives them
        self.open: str | None = None     # the type of the block being written (None: none)
        self.args: dict[int, list[str]] = {}  # per tool_use block: its input JSON pieces

    def _start(self, out: list, block: dict) -> None:
        out += self.close()
        self.open = block["type"]
        self.content.append(block)
        out.append({"type": "content_block_start", "index": len(self.content) - 1,
                    "content_block": {**block, "input": {}} if block["type"] == "tool_use" else dict(block)})

    def _delta(self, out: list, delta: dict) -> None:
        out.append({"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta})

    def feed(self, events) -> list[dict]:
        out: list[dict] = []
        for kind, v in events:
            if kind in ("reasoning", "content"):
                if not v:
                    continue
                block, key = ("thinking", "thinking") if kind == "reasoning" else ("text", "text")
                if self.open != block:
                    self._start(out, {"type": "thinking", "thinking": "", "signature": ""} if block == "thinking"
                                else {"type": "text", "text": ""})
                self.content[-1][key] += v
                self._delta(out, {"type": f"{block}_delta", key: v})
            elif kind == "tool_call":
                if "id" in v:  # a call begins: its own block
                    self._start(out, {"type": "tool_use", "id": tool_use_id(v["id"]), "name": v["function"]["name"]})
                    self.args[len(self.content) - 1] = []
                piece = v["function"].get("arguments") or ""
                if piece:
                    self.args[len(self.content) - 1].append(piece)
                    self._delta(out, {"type": "input_json_delta", "partial_json": piece})
        return out

    def close(self) -> list[dict]:
        """End the open block (the tool_use block's input is set now, from its pieces)."""
        if self.open is None:
            return []
        i = len(self.content) - 1
        if self.open == "tool_use":
            self.content[i]["input"] = partial_object("".join(self.args[i]))
        self.open = None
        return [{"type": "content_block_stop", "index": i}]
