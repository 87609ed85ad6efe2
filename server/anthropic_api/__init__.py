"""Anthropic's API: one typed request model per endpoint (POST /v1/messages: messages.py,
/v1/messages/count_tokens: count_tokens.py) and the content blocks, tools and options they hold (parts.py).
messages_api.py parses a body once into its model; messages_request.py translates it to the chat format. The
models are where each field is known, typed, checked (validators), and said to be honoured, ignored or refused."""

from .count_tokens import CountTokensRequest
from .messages import MessagesRequest
from .parts import BLOCKS, MessageParam, Metadata, OutputConfig, Thinking, Tool, ToolChoice
