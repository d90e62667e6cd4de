"""Shared CLI plumbing: user errors become one sentence on stderr and exit status 2."""

from __future__ import annotations

import functools
import logging
import sys

import click

from hasfl_ray.errors import ConfigError, RunError


def user_errors(function):
    """Turn :class:`ConfigError` into ``Error: <sentence>`` and exit status 2, and :class:`RunError` (a write that
    failed, a trainer that raised) into its sentence and exit status 1 (no traceback for either)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ConfigError as error:
            click.echo(f"Error: {error}", err=True)
            sys.exit(2)
        except RunError as error:
            click.echo(f"Error: {error}", err=True)
            sys.exit(1)

    return wrapper


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
