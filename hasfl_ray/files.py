"""Durable, atomic file writes (every output of a run is replaced whole or not at all), and careful reads of files
a user may have edited or replaced (refused in one sentence, never a hang or a traceback)."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import stat
import tempfile
from typing import IO, Any, BinaryIO, Iterable, Iterator, List, Optional, Sequence

from hasfl_ray.errors import DataError

#: Temporary files of an atomic write, left by a process killed mid-write.
TEMP_PREFIX = ".tmp-"


@contextlib.contextmanager
def _atomic_replace(path: str, mode: str, **open_kwargs) -> Iterator[IO]:
    """A handle on a temporary file beside ``path`` that replaces ``path`` (fsync, rename, fsync of the directory)
    only when the block ends without an error; on an error the temporary file goes and ``path`` is untouched."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMP_PREFIX)
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
            raise _not_regular(path, what, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException as error:
        # a signal may land after fdopen took the descriptor and its handle was dropped (which closed it): never
        # let that second close's EBADF hide the interruption (or the sentence) being raised
        with contextlib.suppress(OSError):
            os.close(fd)
        if isinstance(error, OSError):
            raise DataError(f"{what} {path!r} could not be read ({error.strerror or type(error).__name__}); "
                            "expected a readable file") from error
        raise


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (``os.stat``'s ``st_mode``) is, for sentences: a file, a folder, a FIFO (a named pipe),
    a device, a socket."""
    return "a file" if stat.S_ISREG(mode) else "a folder" if stat.S_ISDIR(mode) else \
        "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
        else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def path_kind(path: str) -> str:
    """:func:`kind_of` of ``path`` (following a link), or "a link to nothing"."""
    try:
        return kind_of(os.stat(path).st_mode)
    except OSError:
        return "a link to nothing" if os.path.islink(path) else "not readable"


def _not_regular(path: str, what: str, mode: int) -> DataError:
    """The one sentence for a path that is not a regular file: a FIFO, a folder, a device or a socket."""
    return DataError(f"{what} {path!r} is {kind_of(mode)}; expected a regular file")


def check_regular(path: str, what: str) -> None:
    """One :class:`DataError` sentence, :func:`open_regular`'s, when ``path`` exists but is not a regular file
    (a FIFO, a folder, a device or a socket): for a file another reader opens (a plug-in's FILE.py, imported by
    Python), checked before that reader can block on it. Nothing when it is one, or is missing (the caller says
    that in its own words)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise _not_regular(path, what, mode)


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


# ------------------------------------------------------------------------------------------ folders we write

def make_folders(path: str) -> List[str]:
    """Make the folder ``path`` and its missing parents; the folders made, outermost first. When one cannot be
    made, those made before it are removed and the OSError raised."""
    missing = []
    folder = path.rstrip(os.sep) or path
    while folder and not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    made: List[str] = []
    try:
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
            except FileExistsError:  # "a/.." once "a" is made; or made by someone else meanwhile: not ours
                continue
            made.append(folder)
    except OSError:
        remove_made(made)
        raise
    return made


def remove_made(folders: Sequence[str], files: Iterable[str] = ()) -> None:
    """Undo a start that failed: remove ``files``, then ``folders`` (outermost first, as :func:`make_folders`
    lists them) from the innermost out while they are empty; a folder something else has since written into stays,
    with its parents."""
    for name in files:
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
    for folder in reversed(folders):
        try:
            os.rmdir(folder)
        except OSError:
            break


#: The mark hasfl-ray leaves in a folder it makes (or finds empty) for files that are not a run's: the folder is
#: then hasfl-ray's, and its files of that kind may be written again. A run directory is known by its config.yaml
#: instead (``hasfl_ray.engine.rundir``).
OWNER_MARK = ".hasfl-ray-folder"
#: What such a folder holds, by kind: the names (globs) of the files hasfl-ray writes there.
FOLDER_KINDS = {"report": ("*.md", "*.csv", "*.tex", "*.png", "*.json"), "control variates": ("client_*.pt",)}


def folder_owner(path: str) -> Optional[str]:
    """The kind of files (:data:`FOLDER_KINDS`) hasfl-ray marked ``path`` for, or None: no mark, or one that is
    not hasfl-ray's (never followed through a link, never read from a FIFO)."""
    mark = os.path.join(path, OWNER_MARK)
    if os.path.islink(mark):
        return None
    try:
        data = json.loads(read_text(mark, "folder mark", "hasfl-ray's mark"))
    except (DataError, ValueError, RecursionError):
        return None
    holds = data.get("holds") if isinstance(data, dict) and data.get("written_by") == "hasfl-ray" else None
    return holds if holds in FOLDER_KINDS else None


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def ownership_problem(path: str, holds: str) -> Optional[str]:
    """Why hasfl-ray may not write its ``holds`` files (:data:`FOLDER_KINDS`) into the folder ``path``, as a phrase
    for a sentence; None when it may: the folder is missing or empty (temporary files aside), or carries hasfl-ray's
    mark for ``holds``. The one ownership rule of every folder hasfl-ray writes besides a run directory: a user's
    files (a table.md, a client_0.pt) are never overwritten."""
    if not os.path.isdir(path):
        return None
    entries = sorted(name for name in os.listdir(path) if not name.startswith(TEMP_PREFIX))
    if not entries:
        return None
    owner = folder_owner(path)
    if owner == holds:
        return None
    if owner is not None:
        return f"is hasfl-ray's {owner} folder, not its {holds} folder"
    return f"holds {_listed(entries)} and no hasfl-ray mark ({OWNER_MARK})"


class FolderClaim:
    """A folder made (or found empty) and marked for hasfl-ray's ``holds`` files by :func:`claim_folder`;
    :meth:`undo` takes back what the claim made, for a start that is refused after it."""

    def __init__(self, path: str, holds: str, made: List[str], marked: bool):
        self.path, self.holds, self.made, self.marked = path, holds, made, marked

    def undo(self) -> None:
        """Remove the mark this claim wrote and, from a folder it made, the files of its kind written since (and
        temporary ones), then the folders it made while they are empty; a folder that held anything before the
        claim keeps it."""
        files = [os.path.join(self.path, OWNER_MARK)] if self.marked else []
        if self.made and os.path.isdir(self.path):
            files += [entry.path for entry in os.scandir(self.path) if entry.is_file(follow_symlinks=False) and (
                entry.name.startswith(TEMP_PREFIX) or
                any(fnmatch.fnmatchcase(entry.name, p) for p in FOLDER_KINDS[self.holds]))]
        remove_made(self.made, files)


def claim_folder(path: str, holds: str) -> FolderClaim:
    """Make the folder ``path`` (and its missing parents) and mark it as hasfl-ray's folder of ``holds`` files,
    after :func:`ownership_problem` said it may be written; the OSError of a folder or mark that cannot be made."""
    made = make_folders(path)
    marked = folder_owner(path) != holds
    if marked:
        try:
            atomic_write(os.path.join(path, OWNER_MARK),
                         (json.dumps({"written_by": "hasfl-ray", "holds": holds}) + "\n").encode())
        except OSError:
            remove_made(made)
            raise
    return FolderClaim(path, holds, made, marked)
