"""Anthropic's API: one typed request model per endpoint (POST /v1/messages: messages.py,
/v1/messages/count_tokens: count_tokens.py) and the content blocks, tools and options they hold (parts.py).
messages_request.py translates a checked request to the chat format; the models are where each field is
known, typed, and said to be honoured, ignored or refused."""

from .count_tokens import CountTokensRequest
from .messages import MessagesRequest
from .parts import BLOCKS, MessageParam, Metadata, OutputConfig, Thinking, Tool, ToolChoice
