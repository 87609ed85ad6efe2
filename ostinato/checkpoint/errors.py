"""One error type for everything wrong with a checkpoint on disk, always naming where."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint (config.json, index, shard or tensor) is missing, malformed or inconsistent.

    The message always names the file and, where one is at fault, the tensor or config field.
    """

    def __init__(self, path: object, problem: str, tensor: str | None = None, field: str | None = None):
        self.path = str(path)
        self.tensor = tensor
        self.field = field
        where = self.path
        if tensor is not None:
            where += f": tensor '{tensor}'"
        if field is not None:
            where += f": field '{field}'"
        super().__init__(f"{where}: {problem}")
