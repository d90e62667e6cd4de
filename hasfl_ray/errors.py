"""Exceptions for bad user input: the CLI turns them into one sentence and exit status 2."""


class ConfigError(ValueError):
    """A config value, flag or argument is invalid; the message is one sentence naming the thing,
    the value and what was expected."""


class DataError(ConfigError):
    """A dataset file is missing, unreadable, corrupt or truncated, or a download failed."""


class OutputError(RuntimeError):
    """An output of a run could not be written (disk full, permissions); the message is one sentence saying what
    was kept. The CLI prints it and exits with status 1."""
