"""Durable, atomic file writes: every output of a run is replaced whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


@contextlib.contextmanager
def _atomic_replace(path: str, mode: str, **open_kwargs) -> Iterator[IO]:
    """A handle on a temporary file beside ``path`` that replaces ``path`` (fsync, rename, fsync of the directory)
    only when the block ends without an error; on an error the temporary file goes and ``path`` is untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; an output gets the mode open() would give it
        with os.fdopen(fd, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def _umask() -> int:
    """The process's umask (read by setting it and setting it back: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_text_writer(path: str):
    """A text handle whose content replaces ``path`` only when the block ends without an error: for outputs written
    piece by piece (clients.csv of a million clients) instead of built in memory first."""
    return _atomic_replace(path, "w", encoding="utf-8", newline="")


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: readers see old or new, never half."""
    with _atomic_replace(path, "wb") as handle:
        handle.write(data)


def _fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable (a crash right after it keeps the new file)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not fsync directories; the rename itself is still atomic
    finally:
        os.close(fd)
