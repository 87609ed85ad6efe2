"""One server per --session-dir: an exclusive lock on <dir>/.lock, taken before the model loads.

Two servers sharing a folder would delete each other's files (session_store.py bounds the folder by
deleting the least recently used). The lock is flock(2) on an open file: the kernel drops it when the
process ends in any way (exit, crash, SIGKILL, OOM kill), so a crashed server never leaves the folder
stuck; the pid written into the file only names the holder in the refusal. A stale pid in a file that
nobody holds is simply overwritten.

    lock = SessionDirLock.take(folder)   # SessionDirBusy naming the folder and the holder's pid
    ...                                  # held for the life of the server
    lock.release()
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"


class SessionDirBusy(OSError):
    pass


class SessionDirLock:
    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def take(cls, folder: str | Path) -> SessionDirLock:
        folder = Path(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / LOCK_NAME
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise SessionDirBusy(f"--session-dir {folder}: cannot create its lock file: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SessionDirBusy(f"--session-dir {folder} is in use by another server (pid {holder}); give each "
                                 f"server its own folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = -1
