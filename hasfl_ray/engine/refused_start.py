"""A new run's start refused for bad input once it began writing its run directory (a plug-in's first dispatch
handing out channel sets, masks or a depth the checks refuse; a DataError, a PluginInputError), before any round was
recorded: what the start wrote goes again, so bad input never leaves a half-written run (issue 44). A resumed run,
or one with a recorded round, is never touched; ``Engine.run`` calls these."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from typing import Any, Iterable, Optional

from hasfl_ray.engine.earlier_run import drop, has_aside, restore, set_aside, settle
from hasfl_ray.errors import ConfigError

#: A start that saved a checkpoint (an asynchronous run checkpoints server updates before its first line) is kept.
CHECKPOINT = os.path.join("checkpoints", "latest.pt")


def begin_start(engine: Any, lock: Any) -> Optional[set]:
    """The run directory as a start of ``engine`` (:class:`~hasfl_ray.engine.Engine`) begins writing it, under its
    lock: under ``--force`` (not on resume) the earlier run's entries set aside (:mod:`.earlier_run`, put back by
    :func:`end_start` where the start is refused, deleted once the new run records a line or ends); then, for a new
    run (no checkpoint, no history, not resumed unless ``lock`` made its folder), the names it holds, so that
    :func:`undo_refused_start` can leave it as it was; None otherwise (a resumed run, or no run directory, is never
    undone)."""
    rundir = engine.rundir
    if rundir is None:
        return None
    settle(rundir.path)  # a folder a --force start killed in between left: the new run's, or the earlier one back
    if engine.force and not engine.resume:  # the earlier run set aside, not deleted: a refused start puts it back
        rundir.check_clearable()
        rundir.earlier = set_aside(rundir.path)
    new = (not engine.resume or bool(lock.made)) and engine.checkpoint is None and not engine.history
    return set(os.listdir(rundir.path)) if new else None


def undo_refused_start(engine: Any, found: Optional[set]) -> bool:
    """Called in the ``finally`` of ``Engine.run``: where a new run (``found``, :func:`begin_start`) is being
    refused for bad input (a ConfigError: a plug-in's first dispatch, a DataError, a PluginInputError) before any
    round was recorded, remove what this start wrote (:func:`remove_written`) and return True, so the run is undone
    as a start refused before it (its folders go too, ``remove_made``); False otherwise."""
    if found is None or engine.history or not isinstance(sys.exc_info()[1], ConfigError):
        return False
    if os.path.lexists(os.path.join(engine.rundir.path, CHECKPOINT)):  # state saved (an async run's updates): kept
        return False
    remove_written(engine.rundir.path, found)
    return True


def remove_written(path: str, found: Iterable[str]) -> None:
    """Undo a run's start that was refused before its first round was recorded: remove every entry of the run
    directory ``path`` that is not in ``found`` (what it held before the start: nothing, for a folder the start made
    or found empty), so it is left as it was; a folder the start made goes with the files the run wrote in it."""
    found = set(found)
    for entry in os.scandir(path):
        if entry.name in found:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def end_start(engine: Any, started: bool, made_log: bool) -> None:
    """Called under the run's lock as ``Engine.run`` ends, after :func:`undo_refused_start`: where the new run never
    began (no config.yaml written, or its start undone as bad input) the log.txt it made goes (``made_log``) and the
    earlier run a ``--force`` start set aside is put back; otherwise (it finished, stopped, failed, or recorded a
    line) the earlier run is deleted."""
    rundir = engine.rundir
    if rundir is not None and not started and made_log:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rundir.file("log.txt"))
    if rundir is None or not rundir.earlier:
        return
    rundir.earlier = False
    if not has_aside(rundir.path):  # deleted as the first line was recorded
        return
    if started:
        drop(rundir.path)
    else:
        restore(rundir.path)
