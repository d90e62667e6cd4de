"""Which front end started the run, so that a sentence names what its caller can use: the command line's flags
(``--resume``, ``--force``, ``--out``) from ``hasfl-ray``, the keywords (``resume=True``, ``force=True``,
``out_dir``) from the Python API (``hasfl_ray.simulate``, an ``Engine`` of one's own). The one place that knows:
the CLI's group marks every command it runs (:func:`command_line`, ``cli/main.py``); anything else is the API.
A context variable, so a command run in-process (click's test runner) leaves the API's wording to what follows."""

from __future__ import annotations

import contextlib
import contextvars
import shlex
from typing import Iterator

_COMMAND_LINE = contextvars.ContextVar("hasfl_ray_command_line", default=False)

#: Each option a sentence names: its flag on the command line, its keyword in the Python API.
OPTIONS = {"resume": ("--resume", "resume=True"), "force": ("--force", "force=True"), "out": ("--out", "out_dir")}


def on_command_line() -> bool:
    """Whether the running code was started by a ``hasfl-ray`` command."""
    return _COMMAND_LINE.get()


@contextlib.contextmanager
def command_line() -> Iterator[None]:
    """Mark what runs inside as started by a ``hasfl-ray`` command (the CLI's group, around each command)."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def option(name: str) -> str:
    """How the caller spells option ``name`` (a key of :data:`OPTIONS`): ``--resume`` or ``resume=True``."""
    flag, keyword = OPTIONS[name]
    return flag if on_command_line() else keyword


def resume_command(path: str) -> str:
    """What continues the run in ``path``: the command, or the API's call."""
    if on_command_line():
        return f"hasfl-ray simulate --out {shlex.quote(path)} --resume"
    return f"hasfl_ray.simulate(..., out_dir={path!r}, resume=True)"
