"""Random checkpoints in the official DeepSeek-V4 format, for tests, benchmarks and the demo: tiny
models, or slices of V4-Flash at its real dimensions."""

from .presets import FLASH, PRESETS, flash_config, preset_config
from .writer import write_tiny_checkpoint
