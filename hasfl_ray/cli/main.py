"""The `hasfl-ray` console script: a click group whose subcommands live one module each in this package."""

from __future__ import annotations

import click

from hasfl_ray import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hasfl-ray")
def main() -> None:
    """hasfl-ray: simulate HAS-FL and sub-model federated learning baselines."""


def _register() -> None:
    # Each module adds its commands to `main`; imported here so `hasfl-ray --help` lists them all.
    from hasfl_ray.cli import cost, data, report, simulate  # noqa: F401
    from hasfl_ray.cli import bench, info  # noqa: F401


_register()
