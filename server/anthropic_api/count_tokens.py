"""POST /v1/messages/count_tokens: the fields of a Messages request that shape the prompt, as anthropic's
MessageCountTokensParams defines them (no max_tokens, no sampling, no bookkeeping)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import StrictStr

from ..fields import RequestModel
from .parts import CacheControl, OutputConfig


class CountTokensRequest(RequestModel):
    model: Any = None
    messages: Any = None                          # MessageParam each, read in order by messages_request.py
    system: Any = None                            # a string or text blocks
    tools: Any = None                             # Tool each
    tool_choice: Any = None                       # ToolChoice
    thinking: Any = None                          # Thinking
    cache_control: CacheControl | None = None     # ignored: every prefix is cached here, unasked
    output_config: OutputConfig | None = None     # effort honoured (DSV4's reasoning effort), format refused
    speed: Literal["standard", "fast"] | None = None  # ignored: this server has one speed
    user_profile_id: StrictStr | None = None      # ignored: Anthropic's account bookkeeping
    workspace_id: StrictStr | None = None         # ignored: likewise

    def refused(self) -> None:
        if self.output_config is not None:
            self.output_config.refused()
