"""hasfl_ray/interrupts.py in one process (issue 49 item 1): a signal that lands inside an import is kept and raised
as soon as the import has ended, never inside it, whether the main thread runs the import or waits for another
thread's (Ray's start imports in a thread of its own); outside an import it is raised at once; a second one while the
first is kept goes to the console script's at-once exit; the KeyboardInterrupt names its signal. Every signal is
raised by the test at the point it means, never by a timer."""

import importlib
import signal
import sys
import threading

import pytest

from hasfl_ray import interrupts
from hasfl_ray.cli.interrupts import interrupted
from hasfl_ray.engine.signals import StopSignals
from hasfl_ray.interrupts import Interrupt


@pytest.fixture
def handled():
    """SIGINT and SIGTERM go to hasfl_ray.interrupts.handle, as under the console script; afterwards a kept signal is
    settled (raised here, never into pytest) and the previous handlers come back."""
    interrupts.watch()
    previous = {number: signal.signal(number, interrupts.handle) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    try:
        interrupts.settle()
    except Interrupt:
        pass
    for number, handler in previous.items():
        signal.signal(number, handler)


@pytest.fixture
def module(tmp_path, monkeypatch):
    """``module(name, body)``: a module file importable as ``name``, removed from sys.modules afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def write(name, body):
        (tmp_path / f"{name}.py").write_text(body)
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def test_a_signal_inside_an_import_is_raised_once_the_import_has_ended(handled, module):
    name = module("sent_while_imported", "import signal\nfrom hasfl_ray import interrupts\n"
                  "signal.raise_signal(signal.SIGTERM)\n"
                  "KEPT = interrupts.pending()\n"  # the handler has run (raise_signal runs it): kept, not raised
                  "LAST_LINE = True\n")
    with pytest.raises(Interrupt) as caught:
        importlib.import_module(name)
        interrupts.settle()
        pytest.fail("the kept signal was not raised")
    assert caught.value.signal_number == signal.SIGTERM
    imported = sys.modules[name]  # the import ended whole: the signal was raised after it
    assert imported.KEPT == signal.SIGTERM and imported.LAST_LINE
    assert interrupts.pending() is None


def test_a_signal_while_the_main_thread_waits_for_another_threads_import_is_kept(handled, module):
    """The main thread imports a module another thread is importing (waiting on the import system's lock): a
    signal delivered to it there is kept until that import has ended."""
    main = threading.main_thread().ident
    seen = []
    name = module("imported_by_another_thread", (
        "import signal, sys, time, threading\n"
        "from hasfl_ray import interrupts\n"
        "main = threading.main_thread().ident\n"
        "while not interrupts.importing(sys._current_frames()[main]):\n"  # until the main thread waits for it
        "    time.sleep(0.001)\n"
        "calls = interrupts._State.calls\n"
        "signal.pthread_kill(main, signal.SIGTERM)\n"
        "while interrupts._State.calls == calls:\n"  # until the main thread's handler has seen it
        "    time.sleep(0.001)\n"
        "KEPT = interrupts.pending()\n"
        "LAST_LINE = True\n"))
    other = threading.Thread(target=lambda: seen.append(importlib.import_module(name)))
    other.start()
    try:
        with pytest.raises(Interrupt) as caught:
            while name not in sys.modules:  # the other thread has begun: the main thread now waits for its import
                pass
            importlib.import_module(name)
            interrupts.settle()
            pytest.fail("the kept signal was not raised")
    finally:
        other.join()
    assert caught.value.signal_number == signal.SIGTERM and main == threading.get_ident()
    assert seen and seen[0].KEPT == signal.SIGTERM and seen[0].LAST_LINE


def test_a_signal_outside_an_import_is_raised_at_once(handled):
    assert not interrupts.importing(sys._getframe())
    with pytest.raises(Interrupt) as caught:
        signal.raise_signal(signal.SIGINT)
    assert caught.value.signal_number == signal.SIGINT and interrupts.pending() is None


def test_a_second_signal_while_one_is_kept_goes_to_the_at_once_exit(handled, module):
    insisted = []

    class Ended(BaseException):
        pass

    def at_once(number):
        insisted.append(number)
        raise Ended  # (the console script's exits the process here)

    previous = interrupts.when_insisted(at_once)
    try:
        name = module("sent_twice_while_imported", "import signal\nsignal.raise_signal(signal.SIGINT)\n"
                      "signal.raise_signal(signal.SIGINT)\nLAST_LINE = True\n")
        with pytest.raises(Ended):
            importlib.import_module(name)
    finally:
        interrupts.when_insisted(previous)
    assert insisted == [signal.SIGINT] and interrupts.pending() is None


def test_a_runs_second_sigterm_names_sigterm(capsys):
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested() and stop.signal_number == signal.SIGTERM
        with pytest.raises(Interrupt) as caught:
            signal.raise_signal(signal.SIGTERM)
    assert interrupts.signal_number(caught.value) == signal.SIGTERM
    assert interrupts.signal_number(KeyboardInterrupt()) == signal.SIGINT  # Python's own: SIGINT
    with pytest.raises(SystemExit) as stopped:
        interrupted("before the command finished", caught.value)
    assert stopped.value.code == 143
    assert capsys.readouterr().err == "Interrupted by SIGTERM before the command finished.\n"
