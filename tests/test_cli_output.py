"""A command whose reader stops early (`ostinato-inspect DIR | head` under pipefail, with PYTHONUNBUFFERED=1 as
CI often sets) exits 0 without a traceback: the demo pipes it that way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CLOSED_READER = """
import os, sys
from ostinato.cli.inspect import main
r, w = os.pipe()
os.close(r)              # the reader is gone before the first byte: every write is a broken pipe
os.dup2(w, sys.stdout.fileno())
sys.exit(main([sys.argv[1], "--tensors"]))
"""


@pytest.mark.slow  # a fresh interpreter importing the CLI, seconds
def test_inspect_into_a_closed_pipe_exits_0(tiny_ckpt):
    r = subprocess.run([sys.executable, "-c", CLOSED_READER, str(tiny_ckpt)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr
