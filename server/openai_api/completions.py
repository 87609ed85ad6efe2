"""POST /v1/completions: every field openai's completion_create_params defines, and return_token_ids (vLLM's
extension, completions.py). Honoured: model, prompt, max_tokens, stream, stream_options, the sampling fields,
logprobs (the legacy int 0..5), user (checked, ignored). Refused unless unset: echo (the prompt is never
repeated), suffix (no fill-in-the-middle), best_of (one candidate is generated)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictStr, ValidationInfo, field_validator

from ..fields import context, flag, integer, refuse
from ..sampling import MAX_LEGACY_LOGPROBS
from .generation import GenerationRequest

PROMPT_REQUIRED = "prompt is required and must not be empty"


def check_prompt(v: Any, vocab: int | None) -> str | list[int]:
    """A prompt as text or token ids (ids below `vocab` where it is known); a batch of one prompt is that one."""
    if isinstance(v, str):
        return v
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        return check_prompt(v[0], vocab)
    if isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        bad = [i for i in v if vocab is not None and not 0 <= i < vocab]
        if bad:
            refuse(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", "prompt")
        return list(v)
    refuse("prompt must be a string, a list of token ids, or a list holding one of them (batches of several "
           "prompts are not supported)", "prompt")


class CompletionRequest(GenerationRequest):
    check_order = ("echo", "suffix", "best_of", "stream", "stream_options", "user", "model", "prompt", "n",
                   "logprobs", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "logit_bias",
                   "return_token_ids", "stop", "max_tokens")
    refusals = {"echo": ((None, False), "the prompt is not repeated in the reply here"),
                "suffix": ((None, ""), "fill-in-the-middle (a suffix) is not available here"),
                "best_of": ((None, 1), "one candidate is generated per request here")}

    logprobs: int | None = None           # the legacy API's: how many top tokens (0..5) with each token's
    prompt: str | list[int] | None = Field(None, validate_default=True)  # text, or token ids: required
    return_token_ids: bool | None = None
    echo: StrictBool | None = None
    suffix: StrictStr | None = None
    best_of: Any = None

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs(cls, v):
        return integer(v, "logprobs", 0, MAX_LEGACY_LOGPROBS)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v, info: ValidationInfo):
        if v in (None, "", []):
            refuse(PROMPT_REQUIRED, "prompt")
        return check_prompt(v, context(info, "vocab"))

    @field_validator("return_token_ids", mode="before")
    @classmethod
    def _return_token_ids(cls, v):
        return flag(v, "return_token_ids")

    def logprob_counts(self) -> tuple[bool, int]:
        return self.logprobs is not None, self.logprobs or 0
