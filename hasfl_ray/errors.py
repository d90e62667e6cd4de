"""Exceptions for bad user input: the CLI turns them into one sentence and exit status 2."""

import difflib
from typing import Iterable


#: The command that installs Ray, for the sentences that ask for it.
RAY_INSTALL = 'pip install "ray>=2.9"'


class ConfigError(ValueError):
    """A config value, flag or argument is invalid; the message is one sentence naming the thing,
    the value and what was expected."""


class DataError(ConfigError):
    """A dataset file is missing, unreadable, corrupt or truncated, or a download failed."""


class RunError(RuntimeError):
    """A run could not go on (not bad input): the message is one sentence; the CLI prints it and exits with 1."""


class OutputError(RunError):
    """An output of a run could not be written (disk full, permissions); the message says what was kept."""


class TrainerError(RunError):
    """Training a client raised inside a trainer (in process or in a Ray actor).

    Attributes:
        remote_traceback: the trainer's traceback, for RUN/log.txt rather than the terminal.
    """

    def __init__(self, message: str, remote_traceback: str = ""):
        super().__init__(message)
        self.remote_traceback = remote_traceback


class PluginError(RunError):
    """A plug-in's method (an algorithm's or a dataset's) raised, or returned what the run cannot use (the message is
    one sentence naming the plug-in and the method).

    Attributes:
        remote_traceback: the plug-in's traceback (empty for a bad return value), for RUN/log.txt only.
    """

    def __init__(self, message: str, remote_traceback: str = ""):
        super().__init__(message)
        self.remote_traceback = remote_traceback


class PluginInputError(PluginError, ConfigError):
    """A plug-in handed the run a sub-model description it cannot use (a mask of the wrong shape or dtype, of a
    parameter the model lacks): bad input, so the CLI prints its one sentence and exits with status 2."""


class ActorLostError(TrainerError):
    """A Ray actor the run cannot go on without died (the server, a trainer lost too often) or failed to start: one
    sentence (the Engine adds how to resume), Ray's report in ``remote_traceback`` for RUN/log.txt."""


class RoundInterrupted(Exception):
    """A stop was requested (Ctrl-C, SIGTERM) while a round ran: raised at the end of a client (or while the clock
    scanned for an available client), before the round reaches the server, so the global model is still that of
    the last completed round. (Its former home, ``hasfl_ray.engine.backend``, still exports it.)"""


class EvaluationInterrupted(Exception):
    """A stop was requested (Ctrl-C, SIGTERM) while a round's local-accuracy pass ran, after the round's update was
    applied: the engine records the round without its local accuracy and stops with a checkpoint; ``--resume``
    computes the pass first (docs/RELIABILITY.md)."""


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped a run after a checkpoint was written; the CLI exits with 128 + the signal number.

    Attributes:
        signal_number: the signal that stopped it.
        rounds_done: rounds completed (and checkpointed).
        run_dir: the run directory (None when the run wrote none).
    """

    def __init__(self, signal_number: int, rounds_done: int, run_dir=None, mode: str = "sync"):
        super().__init__(f"interrupted by signal {signal_number} after {progress_phrase(rounds_done, mode)}")
        self.signal_number, self.rounds_done, self.run_dir, self.mode = signal_number, rounds_done, run_dir, mode

    @property
    def done(self) -> str:
        """What the run completed: "8 completed rounds", or an asynchronous run's "8 server updates"."""
        return progress_phrase(self.rounds_done, self.mode)


def progress_phrase(count: int, mode: str = "sync") -> str:
    """``count`` rounds completed, in the words of the run's ``mode``: "8 completed rounds" (sync), "8 server
    updates" (async: its history counts server updates, docs/async.md), singular for 1."""
    unit = "server update" if mode == "async" else "completed round"
    return f"{count} {unit}{'' if count == 1 else 's'}"


def expected_one_of(value: object, choices: Iterable[str], what: str = "one of") -> str:
    """The end of a one-sentence error: a did-you-mean when ``value`` is close to one choice, the choices when they
    are few (at most 12), else a pointer to where they are listed (so the sentence stays short)."""
    choices = list(choices)
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6) if isinstance(value, str) else []
    listed = f"expected {what} {', '.join(choices)}" if len(choices) <= 12 else \
        f"expected {what} the {len(choices)} listed by `hasfl-ray simulate --help`"
    return f"did you mean {close[0]!r}? ({listed})" if close and len(choices) <= 12 else \
        f"did you mean {close[0]!r}?" if close else listed
