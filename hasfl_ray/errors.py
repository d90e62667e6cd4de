"""Exceptions for bad user input: the CLI turns them into one sentence and exit status 2."""

import difflib
from typing import Iterable


class ConfigError(ValueError):
    """A config value, flag or argument is invalid; the message is one sentence naming the thing,
    the value and what was expected."""


class DataError(ConfigError):
    """A dataset file is missing, unreadable, corrupt or truncated, or a download failed."""


class OutputError(RuntimeError):
    """An output of a run could not be written (disk full, permissions); the message is one sentence saying what
    was kept. The CLI prints it and exits with status 1."""


def expected_one_of(value: object, choices: Iterable[str], what: str = "one of") -> str:
    """The end of a one-sentence error: a did-you-mean when ``value`` is close to one choice, the choices when they
    are few (at most 12), else a pointer to where they are listed (so the sentence stays short)."""
    choices = list(choices)
    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6) if isinstance(value, str) else []
    listed = f"expected {what} {', '.join(choices)}" if len(choices) <= 12 else \
        f"expected {what} the {len(choices)} listed by `hasfl-ray simulate --help`"
    return f"did you mean {close[0]!r}? ({listed})" if close and len(choices) <= 12 else \
        f"did you mean {close[0]!r}?" if close else listed
