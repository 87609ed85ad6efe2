"""What every ostinato-* command shares: refusing bad input before any work, and exit codes.

Exit codes, the same for every command: 0 done; 1 refused input (a bad file, field or value,
said in one line naming it); 2 usage (argparse: an unknown option, a missing argument).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

EXIT_REFUSED = 1
EXIT_USAGE = 2


class InputError(ValueError):
    """A command-line value that cannot work; the message names the option and the value."""


def print_output(text: str) -> None:
    """Print a command's output; a reader that stops early (`| head`) is not an error. stdout then points
    to /dev/null, so the interpreter's flush at exit does not raise either."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def refuse(prog: str, error: Exception | str) -> int:
    """Print `prog: error: ...` on one line to stderr; the exit code for refused input."""
    print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
    return EXIT_REFUSED


def check_output_file(path: Path, option: str) -> None:
    """Refuse an output path that cannot be written, before the work that would fill it."""
    if path.is_dir():
        raise InputError(f"{option} {path}: is a directory, expected a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{option} {path}: not writable")
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"{option} {path}: {folder} is not a directory")
    try:  # os.access says yes to root on read-only mounts: write a probe instead
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".ostinato-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InputError(f"{option} {path}: cannot write in {folder} ({e.strerror})") from None


def check_model_dir(path: Path, option: str = "MODEL") -> None:
    """Refuse a checkpoint path that is missing or not a folder."""
    if not path.exists():
        raise InputError(f"{option} {path}: no such directory")
    if not path.is_dir():
        raise InputError(f"{option} {path}: is a file, expected a checkpoint directory (with config.json)")
