"""The `hasfl-ray` console script: a click group whose subcommands live one module each in this package, plain click
commands that know nothing of the group; they are all added to it here, in one place.

A command imports the subsystem it runs (the engine, the sweep package, the analysis with scipy, Ray) inside the
command, so `hasfl-ray --help` and every command load only what they use. The console script enters through
:mod:`hasfl_ray.cli.entry`, which answers a Ctrl-C while this module loads."""

from __future__ import annotations

import functools
import sys
from typing import Callable, Iterator

import click

from hasfl_ray import __version__
from hasfl_ray.cli.bench import bench
from hasfl_ray.cli.common import user_errors
from hasfl_ray.cli.cost import cost
from hasfl_ray.cli.data import data
from hasfl_ray.cli.info import info
from hasfl_ray.cli.report import analyze, plot, report
from hasfl_ray.cli.simulate import simulate
from hasfl_ray.cli.sweep import sweep
from hasfl_ray.front_end import command_line
from hasfl_ray.ops.calls import sparse_cuda_kernel


class OneSentenceGroup(click.Group):
    """A click group whose usage errors (an unknown flag, a bad value, a missing argument) print one sentence,
    ``Error: ...``, and exit with status 2, like the commands' own checks, instead of a usage block."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        try:
            with command_line():  # the engine's sentences name this front end's flags (hasfl_ray/front_end.py)
                return super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as error:
            message = " ".join(error.format_message().split())
            command = error.ctx.command_path if error.ctx is not None else "hasfl-ray"
            click.echo(f"Error: {message} (see `{command} --help`)", err=True)
            sys.exit(2)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except click.Abort as error:
            if isinstance(error.__cause__, KeyboardInterrupt):  # Ctrl-C outside a run's own handlers: one line
                from hasfl_ray.cli.interrupts import interrupted

                interrupted("before the command finished", error.__cause__)
            click.echo("Aborted.", err=True)
            sys.exit(1)


@click.group(cls=OneSentenceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hasfl-ray")
def main() -> None:
    """hasfl-ray: simulate HAS-FL and sub-model federated learning baselines."""


#: Every command of `hasfl-ray` (its --help lists them sorted by name).
COMMANDS = (simulate, sweep, report, analyze, plot, cost, data, info, bench)
for _command in COMMANDS:
    main.add_command(_command)


def _leaves(command: click.Command) -> Iterator[click.Command]:
    """The commands that run something under ``command`` (itself, or those of its groups)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from _leaves(sub)
    else:
        yield command


def _environment_checked(callback: Callable) -> Callable:
    """``callback`` after the environment's own settings are checked: HASFL_SPARSE_CUDA_KERNEL, in one sentence and
    exit status 2 (:func:`hasfl_ray.ops.calls.sparse_cuda_kernel`). Every command checks it, not only those that
    aggregate index sets or masks on a card: the variable is the process's and its Ray actors', and the same command
    that ends well on a machine without a card was refused deep in the CUDA op, mid-run, on one. Checked once the
    command's own flags are read, so ``--help`` answers whatever it holds."""

    @functools.wraps(callback)
    def run(*args, **kwargs):
        user_errors(sparse_cuda_kernel)()
        return callback(*args, **kwargs)

    return run


for _leaf in _leaves(main):
    _leaf.callback = _environment_checked(_leaf.callback)
