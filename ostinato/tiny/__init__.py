"""Tiny random checkpoints in the official DeepSeek-V4 format, for tests and the demo."""

from .presets import PRESETS, preset_config
from .writer import write_tiny_checkpoint
