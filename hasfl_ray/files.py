"""Durable, atomic file writes (every output of a run is replaced whole or not at all), and careful reads of files
a user may have edited or replaced (refused in one sentence, never a hang or a traceback)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from typing import IO, Any, BinaryIO, Iterator

from hasfl_ray.errors import DataError


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


def open_regular(path: str, what: str) -> BinaryIO:
    """A binary handle on the regular file ``path``, for a reader that takes a file (``np.fromfile``, gzip,
    ``torch.load``); one :class:`DataError` sentence naming ``what`` when it is missing or unreadable, or when it
    is not a regular file: a FIFO, a device or a socket is refused before a byte is read (opened non-blocking, so a
    FIFO without a writer cannot hang it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise DataError(f"{what} {path!r} could not be read ({error.strerror or type(error).__name__}); expected "
                        "a readable file") from error
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
            raise DataError(f"{what} {path!r} is {kind}; expected a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException as error:
        os.close(fd)
        if isinstance(error, OSError):
            raise DataError(f"{what} {path!r} could not be read ({error.strerror or type(error).__name__}); "
                            "expected a readable file") from error
        raise


def read_regular(path: str, what: str) -> bytes:
    """The bytes of the regular file ``path``; one :class:`DataError` sentence naming ``what`` (e.g. "summary.json
    of run 'runs/x'") when it is missing or unreadable, or when it is not a regular file (see
    :func:`open_regular`)."""
    with open_regular(path, what) as handle:
        try:
            return handle.read()
        except OSError as error:
            raise DataError(f"{what} {path!r} could not be read ({error.strerror or type(error).__name__}); "
                            "expected a readable file") from error


def read_text(path: str, what: str, expected: str) -> str:
    """The UTF-8 text of the regular file ``path`` (see :func:`read_regular`); one :class:`DataError` sentence
    naming ``what`` and ``expected`` when it is not UTF-8."""
    try:
        return read_regular(path, what).decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{what} {path!r} is not UTF-8 text (byte {error.start}); expected {expected}") from None


def read_json(path: str, what: str, expected: str = "the JSON hasfl-ray writes") -> Any:
    """The parsed JSON of the regular file ``path`` (see :func:`read_regular`); one :class:`DataError` sentence
    naming ``what``, the line and column, and ``expected`` when it is not UTF-8 JSON or is nested too deeply for
    the parser (RecursionError: ``[[[[...]]]]`` a hundred thousand deep)."""
    return parse_json(read_text(path, what, expected), f"{what} {path!r}", expected)


def parse_json(text: str, what: str, expected: str) -> Any:
    """``json.loads(text)``, or one :class:`DataError` sentence "``what`` is not valid JSON (the reason, with the
    line and column); expected ``expected``", RecursionError included."""
    try:
        return json.loads(text)
    except ValueError as error:  # json.JSONDecodeError: its message names the line and column
        reason = str(error)
    except RecursionError:
        reason = "nested too deeply to read"
    raise DataError(f"{what} is not valid JSON ({reason}); expected {expected}")
