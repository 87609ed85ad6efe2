"""Online side: checkpoint reading, the model, placement execution, sessions, serving.

The runtime never imports the compiler, jinja2 or a routing profile: the plan is its only input
from the compiler.
"""

from .model import load_model

__all__ = ["load_model"]
