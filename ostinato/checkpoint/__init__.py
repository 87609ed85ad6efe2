"""The official DeepSeek-V4 checkpoint format: config, tensor name map, FP8/MXFP4, lazy reader."""

from .config import ModelConfig
from .errors import CheckpointError
from .sizes import ModelSizes, model_sizes
from .tensor_specs import TensorSpec, model_specs
