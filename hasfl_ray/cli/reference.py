"""docs/cli.md's generated block of ``simulate``'s options by section (:mod:`hasfl_ray.cli.sections`): ``python -m
hasfl_ray.cli.reference [docs/cli.md]`` rewrites it from the command; a test says when it differs."""

from __future__ import annotations

import re
import sys

import click

from hasfl_ray.cli.main import main
from hasfl_ray.cli.sections import options_markdown

#: The markers around the generated block in docs/cli.md.
BEGIN, END = "<!-- simulate-options:begin (python -m hasfl_ray.cli.reference) -->", "<!-- simulate-options:end -->"


def simulate_block() -> str:
    """The block from the command as the console script runs it (the group's context: ``-h`` and ``--help``)."""
    parent = click.Context(main, info_name="hasfl-ray", **main.context_settings)
    simulate = main.commands["simulate"]
    return f"{BEGIN}\n\n{options_markdown(simulate, click.Context(simulate, parent, 'simulate'))}\n{END}"


def rewrite(text: str) -> str:
    """docs/cli.md's ``text`` with its generated block replaced by :func:`simulate_block`."""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    return pattern.sub(lambda _: simulate_block(), text)


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/cli.md"
    with open(path, encoding="utf-8") as handle:
        new = rewrite(handle.read())
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(new)
