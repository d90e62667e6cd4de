"""Interrupts that never land inside an import.

Python's own SIGINT handler raises KeyboardInterrupt at whatever line the main thread runs, and an import is no
place for it: a module left half-imported stays broken for the rest of the process (``import numpy`` cut short
leaves a ``numpy`` without ``nonzero``, later blamed on the dataset that called it), and native code running the
import (torch's, pybind11's) swallows the exception (the run goes on as if no signal came) or aborts on it
("terminate called after throwing ... KeyboardInterrupt"). So :func:`interrupt`, the one place hasfl-ray raises
KeyboardInterrupt from a signal, raises it at once unless the main thread is inside an import; there the signal is
kept, and raised as soon as the outermost import running on the main thread has ended: where that import is an
import statement, right at its end, before the next line runs (:func:`_import`, the console script's import
statement ``__import__``); otherwise a watcher thread sees it end and hands the signal back to the
main thread's current handler (:func:`_thread.interrupt_main`): the exit
comes later by at most the rest of that import. A second signal while one is kept and the import still runs (one
that never ends: a plug-in's?) ends the console script at once, in one line, nothing unwound through the import
(:func:`when_insisted`).

The exception is an :class:`Interrupt`, which knows its signal, so a second SIGTERM that stops a run at once is
reported as SIGTERM (:func:`signal_number`). Used by the console script for its whole life (hasfl_ray.cli.entry:
imports, data loading, Ray's start, the commands outside a run) and by a run's second signal
(hasfl_ray.engine.signals). Standard library only: the console script imports it before anything heavy."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import _thread

TYPE_CHECKING = False  # (typing itself not imported: the console script loads this module before its handlers)
if TYPE_CHECKING:
    from typing import Callable

#: Where a frame of the import system's own code comes from (frozen, or importlib/_bootstrap*.py without freezing).
_IMPORT_FILES = frozenset((sys.modules["_frozen_importlib"]._find_and_load.__code__.co_filename,
                           sys.modules["_frozen_importlib_external"].spec_from_file_location.__code__.co_filename))

#: How often the watcher looks whether the main thread's import has ended, in seconds.
POLL_S = 0.005


class Interrupt(KeyboardInterrupt):
    """KeyboardInterrupt raised for the signal ``signal_number`` (SIGINT or SIGTERM)."""

    def __init__(self, signal_number: int) -> None:
        super().__init__()
        self.signal_number = signal_number


def signal_number(error: BaseException | None) -> int:
    """The signal behind a KeyboardInterrupt: an :class:`Interrupt`'s own, SIGINT for Python's."""
    return getattr(error, "signal_number", signal.SIGINT)


def importing(frame) -> bool:
    """Whether ``frame`` (a frame of the main thread, or None) runs inside an import: a frame of the import system
    (finding, loading, waiting for another thread's import of a module) is below it."""
    while frame is not None:
        if frame.f_code.co_filename in _IMPORT_FILES:
            return True
        frame = frame.f_back
    return False


class _State:
    pending: int | None = None  # a signal kept until the main thread's import ends
    handing = False  # the watcher is handing the kept signal back (the next handler call is that, not a new one)
    calls = 0  # signals seen by a handler (real ones and those handed back)
    watcher: threading.Thread | None = None
    wake_read = wake_write = -1
    lock = threading.Lock()  # taking the kept signal: the outermost import's end (:func:`_import`) or the watcher
    depth = 0  # imports under way on the main thread through the import statement (:func:`_import`)
    original_import = None
    #: What a second signal does while one is kept (see :func:`interrupt`); None: raise it inside the import.
    insisted: Callable[[int], None] | None = None


def noted(number: int) -> bool:
    """Every handler of SIGINT / SIGTERM in hasfl-ray calls this first: the signal is seen, and a signal kept for an
    import's end is now the handler's to act on (it is that signal handed back, or a new one that takes its place).
    True when a signal was kept already and this is a new one: the user insists (:func:`interrupt`).

    Ray's native failure handler (absl's, installed when Ray starts in this process) answers SIGTERM, before Python's
    handler, by arming a 3-second alarm whose native handler aborts the process (exit 134): the signal is answered
    here, so the alarm goes."""
    _State.calls += 1
    insisted = _State.pending is not None and not _State.handing
    _State.pending, _State.handing = None, False
    if number == signal.SIGTERM and "ray" in sys.modules:
        signal.alarm(0)
    return insisted


def interrupt(number: int, frame, insisted: bool = False) -> None:
    """Raise :class:`Interrupt` for signal ``number`` now, or, inside an import (``frame``: the main thread's frame
    a handler was given), when the import has ended (see the module's docstring). ``insisted`` (from :func:`noted`:
    a new signal while one is kept, the import still running: one that never ends, a plug-in's?) inside an import
    calls what :func:`when_insisted` was given, which ends the process at once (the console script's: one line, nothing
    unwound through the import), or, given nothing (a program using hasfl-ray), raises it there, as Python would.
    Call from a signal handler; :func:`watch` must have been called (from ordinary code) before."""
    if _State.watcher is not None and importing(frame):
        if not insisted:
            _State.pending = number
            try:
                os.write(_State.wake_write, b"\0")
            except OSError:  # the pipe full of earlier wake-ups: the watcher is awake already
                pass
            return
        if _State.insisted is not None:
            _State.insisted(number)
    raise Interrupt(number)


def handle(number: int, frame) -> None:
    """A handler of SIGINT and SIGTERM raising :class:`Interrupt` where it is safe (:func:`interrupt`)."""
    interrupt(number, frame, noted(number))


def pending() -> int | None:
    """The signal kept until an import ends, if any."""
    return _State.pending


def settle() -> None:
    """Where a command ends (or its imports), before its handlers go: a signal still kept for an import's end is
    raised now, by the handler it is handed back to (the main thread is not importing here, so the watcher hands it
    back within :data:`POLL_S`: one path raises a kept signal, never two)."""
    while _State.pending is not None and _State.watcher is not None and _State.watcher.is_alive():
        time.sleep(POLL_S)


def when_insisted(callback: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """Call ``callback`` (in the handler, with the signal's number; it does not return: the console script's ends
    the process) for a second signal that comes while one is kept and the import still runs; None: raise it there.
    Returns the callback it replaces."""
    previous, _State.insisted = _State.insisted, callback
    return previous


def watch(statements: bool = False) -> None:
    """``statements``: also raise a kept signal where the outermost import statement ends (:func:`_import`; the
    console script's, for its whole life; a program using hasfl-ray keeps its own ``__import__``). Start the watcher thread that hands a kept signal back once the main thread's import has ended (once per
    process; a daemon waiting on a pipe, woken by :func:`interrupt`). Call from the main thread's ordinary code
    before the handlers that use :func:`interrupt` are installed: never from a handler (starting a thread takes
    locks the interrupted code may hold)."""
    if statements:
        import builtins
        if _State.original_import is None:
            _State.original_import, builtins.__import__ = builtins.__import__, _import
    if _State.watcher is not None:
        return
    _State.wake_read, _State.wake_write = os.pipe()
    os.set_blocking(_State.wake_write, False)
    _State.watcher = threading.Thread(target=_watch, args=(threading.main_thread().ident, _State.wake_read),
                                      name="hasfl-ray-interrupts", daemon=True)
    _State.watcher.start()


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    """The import statement's ``__import__``: a signal kept during an import is raised right where the outermost
    import statement of the main thread ends, before the line after it runs (deterministic: no watcher's poll in
    between); imports another way (``importlib.import_module``) are the watcher's."""
    if threading.get_ident() != _MAIN:
        return _State.original_import(name, globals, locals, fromlist, level)
    _State.depth += 1
    try:
        return _State.original_import(name, globals, locals, fromlist, level)
    finally:
        _State.depth -= 1
        if _State.depth == 0 and _State.pending is not None and not _State.handing:
            with _State.lock:
                number, _State.pending = _State.pending, None
            if number is not None:
                _State.calls += 1
                raise Interrupt(number)


_MAIN = threading.main_thread().ident


def _watch(main: int, wake: int) -> None:
    while True:
        try:
            os.read(wake, 64)
        except OSError:
            return
        while _State.pending is not None:
            frame = sys._current_frames().get(main)
            if frame is None:  # the main thread has ended
                return
            if importing(frame):
                del frame
                time.sleep(POLL_S)
                continue
            del frame
            calls, number = _State.calls, _State.pending
            handler = signal.getsignal(number)
            if not callable(handler):  # Python's handler gone since (SIG_IGN, SIG_DFL): the signal as the OS's
                _State.pending = None
                if handler == signal.SIG_DFL:
                    signal.pthread_kill(main, number)
                break
            with _State.lock:
                if _State.pending is None:  # taken by the outermost import's end (:func:`_import`)
                    break
                _State.handing = True
                _thread.interrupt_main(number)  # the main thread's handler of `number` runs at its next line
            while _State.calls == calls and _State.pending is not None:
                time.sleep(POLL_S)  # one hand-back at a time: the next only once a handler has seen this one


def _forked() -> None:
    """A forked child has no watcher thread: it starts its own if it ever needs one."""
    _State.watcher, _State.pending, _State.handing = None, None, False


os.register_at_fork(after_in_child=_forked)
