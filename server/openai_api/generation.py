"""The fields both OpenAI endpoints define alike (chat.py, completions.py): the model, max_tokens, streaming,
the user, and the sampling fields, which sampling.py checks where it reads them."""

from __future__ import annotations

from typing import Any

from ..fields import RequestModel


class GenerationRequest(RequestModel):
    model: Any = None
    max_tokens: Any = None
    stream: Any = None
    stream_options: Any = None
    user: Any = None
    temperature: Any = None               # the sampling fields: sampling.py checks them
    top_p: Any = None
    seed: Any = None
    n: Any = None
    stop: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    logprobs: Any = None
