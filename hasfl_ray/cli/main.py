"""The `hasfl-ray` console script: a click group whose subcommands live one module each in this package."""

from __future__ import annotations

import sys

import click

from hasfl_ray import __version__


class OneSentenceGroup(click.Group):
    """A click group whose usage errors (an unknown flag, a bad value, a missing argument) print one sentence,
    ``Error: ...``, and exit with status 2, like the commands' own checks, instead of a usage block."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as error:
            message = " ".join(error.format_message().split())
            command = error.ctx.command_path if error.ctx is not None else "hasfl-ray"
            click.echo(f"Error: {message} (see `{command} --help`)", err=True)
            sys.exit(2)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)


@click.group(cls=OneSentenceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hasfl-ray")
def main() -> None:
    """hasfl-ray: simulate HAS-FL and sub-model federated learning baselines."""


def _register() -> None:
    # Each module adds its commands to `main`; imported here so `hasfl-ray --help` lists them all.
    from hasfl_ray.cli import cost, data, report, simulate  # noqa: F401
    from hasfl_ray.cli import sweep  # noqa: F401  (after simulate: it reuses simulate's options)
    from hasfl_ray.cli import bench, info  # noqa: F401


_register()
