"""POST /v1/completions: every field openai's completion_create_params defines, and return_token_ids (vLLM's
extension, completions.py). Honoured: model, prompt, max_tokens, stream, stream_options, the sampling fields,
logprobs (the legacy int 0..5), user (checked, ignored). Refused unless unset: echo (the prompt is never
repeated), suffix (no fill-in-the-middle), best_of (one candidate is generated)."""

from __future__ import annotations

from typing import Any

from pydantic import StrictBool, StrictStr

from ..fields import RequestModel, refuse_unless


class CompletionRequest(RequestModel):
    model: Any = None
    prompt: Any = None
    max_tokens: Any = None
    stream: Any = None
    stream_options: Any = None
    user: Any = None
    temperature: Any = None
    top_p: Any = None
    seed: Any = None
    n: Any = None
    stop: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    logprobs: Any = None
    return_token_ids: Any = None
    echo: StrictBool | None = None
    suffix: StrictStr | None = None
    best_of: Any = None

    def refused(self) -> None:
        refuse_unless(self.echo, (None, False), "echo", "the prompt is not repeated in the reply here")
        refuse_unless(self.suffix, (None, ""), "suffix", "fill-in-the-middle (a suffix) is not available here")
        refuse_unless(self.best_of, (None, 1), "best_of", "one candidate is generated per request here")
