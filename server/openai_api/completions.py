"""POST /v1/completions: every field openai's completion_create_params defines, and return_token_ids (vLLM's
extension, completions.py). Honoured: model, prompt, max_tokens, stream, stream_options, the sampling fields,
logprobs (the legacy int 0..5), user (checked, ignored). Refused unless unset: echo (the prompt is never
repeated), suffix (no fill-in-the-middle), best_of (one candidate is generated)."""

from __future__ import annotations

from typing import Any

from pydantic import StrictBool, StrictStr

from ..fields import refuse_unless
from .generation import GenerationRequest


class CompletionRequest(GenerationRequest):
    prompt: Any = None
    return_token_ids: Any = None
    echo: StrictBool | None = None
    suffix: StrictStr | None = None
    best_of: Any = None

    def refused(self) -> None:
        refuse_unless(self.echo, (None, False), "echo", "the prompt is not repeated in the reply here")
        refuse_unless(self.suffix, (None, ""), "suffix", "fill-in-the-middle (a suffix) is not available here")
        refuse_unless(self.best_of, (None, 1), "best_of", "one candidate is generated per request here")
