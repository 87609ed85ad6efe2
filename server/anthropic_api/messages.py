"""POST /v1/messages: count_tokens' fields and those of generation and bookkeeping, every field anthropic's
MessageCreateParams defines (and the sampling fields older SDKs define: temperature, top_p, top_k).

Honoured: max_tokens, stop_sequences, stream, temperature, top_p, top_k (and count_tokens' fields).
Ignored: metadata, service_tier (checked), inference_geo, diagnostics.
Refused unless unset: container (code execution is not available here).
"""

from __future__ import annotations

from typing import Any

from pydantic import StrictStr

from ..fields import refuse_unless
from .count_tokens import CountTokensRequest


class MessagesRequest(CountTokensRequest):
    max_tokens: Any = None                        # required; messages_request.py names its bounds
    stop_sequences: Any = None
    stream: Any = None
    temperature: Any = None                       # sampling.py checks the sampling fields
    top_p: Any = None
    top_k: Any = None
    metadata: Any = None                          # ignored (checked: only user_id)
    service_tier: Any = None                      # ignored (checked: auto, standard_only)
    container: Any = None
    inference_geo: StrictStr | None = None        # ignored: this server runs where it runs
    diagnostics: dict | None = None               # ignored: Anthropic's prompt-fingerprint comparison

    def refused(self) -> None:
        super().refused()
        refuse_unless(self.container, (None,), "container", "code execution containers are not available here")
