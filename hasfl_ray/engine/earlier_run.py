"""``--force`` over an earlier run without losing it to a refused start: the earlier run's entries are set aside
inside its own folder (:data:`EARLIER`, each moved by one ``rename``), put back where the new start is refused
before it wrote its config.yaml or is undone as bad input (``refused_start``), and deleted once the new run records
its first line or ends any other way. Until then the folder holds both runs' bytes (docs/configs.md says so).

A folder a kill (SIGKILL, OOM) left in between is settled by the next start, resume or ``--force`` there
(:func:`settle`), by one rule: the new run's config.yaml at the top means the new run began (it is the folder's
run, the earlier one goes); none means it never began (the earlier run is put back, over what the start wrote).
``set_aside`` moves config.yaml first and :func:`restore` puts it back last, so the rule holds at every point a
kill can land, and the two runs are never read as one."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil

#: The folder, inside a run directory, that holds the earlier run while a ``--force`` start has recorded nothing.
EARLIER = ".earlier-run"
CONFIG = "config.yaml"


def aside_path(path: str) -> str:
    return os.path.join(path, EARLIER)


def has_aside(path: str) -> bool:
    """Whether ``path`` holds an earlier run set aside (a real folder :data:`EARLIER`, never a link)."""
    aside = aside_path(path)
    return os.path.isdir(aside) and not os.path.islink(aside)


def set_aside(path: str) -> bool:
    """Move every entry of the run directory ``path`` into :data:`EARLIER` (config.yaml first: from then on the
    folder reads as a start not yet begun), under the run's lock; returns whether anything was moved. The caller
    checked that ``path`` may be cleared (``check_clearable``) and settled a leftover (:func:`settle`)."""
    names = sorted((name for name in os.listdir(path) if name != EARLIER), key=lambda name: name != CONFIG)
    if not names:
        return False
    aside = aside_path(path)
    os.mkdir(aside)
    for name in names:
        os.rename(os.path.join(path, name), os.path.join(aside, name))
    _sync(path)
    return True


def restore(path: str) -> None:
    """Put the earlier run back: each entry of :data:`EARLIER` replaces the entry of its name at the top of
    ``path`` (config.yaml last), then the emptied folder goes. What else the refused start wrote is the caller's
    to remove first (``remove_written``)."""
    aside = aside_path(path)
    for name in sorted(os.listdir(aside), key=lambda name: name == CONFIG):
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        elif os.path.lexists(target):
            os.unlink(target)
        os.rename(os.path.join(aside, name), target)
    os.rmdir(aside)
    _sync(path)


def drop(path: str) -> None:
    """The new run began and ends (or recorded its first line): the earlier run set aside is deleted."""
    shutil.rmtree(aside_path(path), ignore_errors=True)


def settle(path: str) -> None:
    """A folder left by a ``--force`` start that was killed in between (under the run's lock): the new run's
    config.yaml at the top keeps the new run (the earlier one is deleted); none puts the earlier run back."""
    if not has_aside(path):
        return
    if os.path.lexists(os.path.join(path, CONFIG)):
        drop(path)
    else:
        restore(path)


def settle_unlocked(path: str) -> None:
    """:func:`settle` before the run takes its lock (the checks read the folder as it will be): only while no
    other process holds the folder's lock, whose own start may be setting its earlier run aside right now."""
    if not has_aside(path):
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another run writes it: its lock refuses this one, with its own sentence
            return
        settle(path)
    finally:
        os.close(fd)  # drops the flock


def _sync(path: str) -> None:
    """The folder's renames to disk (best effort: a filesystem that cannot fsync a folder keeps them in order)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
