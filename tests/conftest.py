"""Shared fixtures: tiny checkpoints are written once per test session."""

from __future__ import annotations

import pytest

from ostinato.compiler.tiny import write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """The default tiny preset (seed 0), written once."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0, progress=False)


@pytest.fixture(scope="session")
def small_ckpt(tmp_path_factory):
    """The larger preset with planted popularity, written once."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "small", "small", seed=1, popularity=1.0,
                                 progress=False)
