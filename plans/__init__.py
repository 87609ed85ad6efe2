"""Checked-in plans, hardware presets and model configs (package data)."""

from importlib import resources
from pathlib import Path


def plans_dir() -> Path:
    """The folder holding the shipped presets and configs (works from a wheel or an editable install)."""
    return Path(str(resources.files(__name__)))
