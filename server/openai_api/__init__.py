"""OpenAI's API: one typed request model per endpoint (POST /v1/chat/completions: chat.py, /v1/completions:
completions.py) and the messages, content parts, tool calls and tools a chat request holds (messages.py).
app.py and completions.py parse a body once into its model and read its typed attributes; the models are where
each field is known, typed, checked (validators), and said to be honoured, ignored or refused."""

from .chat import ChatCompletionRequest
from .completions import CompletionRequest
from .messages import MESSAGES, FunctionTool, TextPart, ToolCall
