"""`simulate --help` and `sweep --help` in sections (issue 45 item 5): Data, Model, Algorithm, Training, Evaluation,
Clock, Async, Privacy, Output and Backend options (sweep's own first), then Other. click has no option groups, so
:class:`SectionedCommand` prints its options section by section (``format_options``); parsing, and the order click
processes options in, are click's own.

An option's section comes from :data:`SECTION_OF`, keyed by its flag: an option this table does not name (one added
since) is listed under Other, never lost. :func:`options_markdown` renders the same sections as the tables of
docs/cli.md's "simulate options by section", which a test compares with the command (``python -m
hasfl_ray.cli.reference`` rewrites that block).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import click

#: The sections in --help order (Other last: every option the table below does not name).
SECTIONS: Dict[str, Tuple[str, ...]] = {
    "Sweep": ("--datasets", "--algorithms", "--seeds", "--cells-per-gpu"),  # sweep's own (simulate has none)
    "Data": ("--dataset", "--data-dir", "--download", "--data-seed", "--partition", "--alpha", "--synthetic-alpha",
             "--synthetic-beta"),
    "Model": ("--model", "--model-norm", "--sbn-statistics", "--sbn-batch-size", "--sbn-statistics-data",
              "--model-scaler", "--sub-model", "--depths", "--global-width", "--widths", "--width-mix",
              "--width-assignment", "--tier-counts"),
    "Algorithm": ("--algorithm", "--algo-opt", "--p-min", "--gamma", "--beta", "--t-adapt", "--warmup", "--t-norm",
                  "--classifier-aggregation", "--aggregation-weights", "--estimator", "--no-coverage", "--mu",
                  "--budget", "--budget-from", "--heterofl-weighting", "--fjord-distill-weight",
                  "--scaffold-global-lr", "--rolex-step", "--control-variates-dir", "--server-optimizer",
                  "--server-lr", "--server-momentum", "--server-beta1", "--server-beta2", "--server-tau"),
    "Training": ("--rounds", "--clients", "--clients-per-round", "--participation", "--seed", "--local-epochs",
                 "--local-steps", "--batch-size", "--lr", "--lr-decay", "--lr-milestones", "--lr-gamma",
                 "--weight-decay", "--momentum", "--augmentation", "--input-normalization", "--masked-loss",
                 "--local-optimizer", "--local-optimizer-options", "--precision"),
    "Evaluation": ("--eval-batch-size", "--eval-samples", "--eval-widths", "--eval-every", "--test-every", "--test-first", "--test-last", "--test-phase",
                   "--local-eval-every",
                   "--local-eval-width", "--local-eval-clients", "--local-eval-rule"),
    "Clock": ("--devices", "--availability", "--deadline", "--deadline-policy", "--overselect", "--dropout"),
    "Async": ("--mode", "--concurrency", "--async-rule", "--buffer-size", "--staleness", "--async-alpha",
              "--async-rho", "--eval-every-updates", "--eval-every-seconds"),
    "Privacy": ("--dp-noise-multiplier", "--dp-clip", "--dp-adaptive-quantile", "--dp-delta", "--dp-epsilon",
                "--dp-accountant"),
    "Output": ("--config", "--out", "--force", "--resume", "--checkpoint-every", "--quiet", "--track", "--json",
               "--verbose",
               "--help"),
    "Backend": ("--backend", "--actors", "--gpus-per-actor", "--address", "--server-placement",
                "--aggregation-backend",
                "--trainer-threads", "--device", "--client-batching", "--cuda-graphs", "--fast-nondeterministic",
                "--fault-inject"),
}
OTHER = "Other"
#: flag -> its section.
SECTION_OF = {flag: section for section, flags in SECTIONS.items() for flag in flags}


def section_of(param: click.Parameter) -> str:
    """The section of ``param``: that of the first of its flags :data:`SECTION_OF` names, else Other."""
    return next((SECTION_OF[flag] for flag in (*param.opts, *param.secondary_opts) if flag in SECTION_OF), OTHER)


def sectioned(command: click.Command, ctx: click.Context) -> List[Tuple[str, List[Tuple[str, str]]]]:
    """(section, [(flags, help)]) of ``command``'s shown options, sections in :data:`SECTIONS` order then Other,
    options in the command's order within a section."""
    records: Dict[str, List[Tuple[str, str]]] = {}
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option):  # arguments are named in the usage line, as click does
            continue
        record = param.get_help_record(ctx)
        if record is not None:
            records.setdefault(section_of(param), []).append(record)
    return [(name, records[name]) for name in (*SECTIONS, OTHER) if records.get(name)]


class SectionedCommand(click.Command):
    """A click command whose --help lists its options in sections (:data:`SECTIONS`)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for name, records in sectioned(self, ctx):
            with formatter.section(f"{name} options"):
                formatter.write_dl(records)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "&#x7C;")


def _flags(record: str) -> str:
    """"-v, --verbose" -> "`-v`, `--verbose`"; "--model-norm [sbn|bn]" -> "`--model-norm` [sbn&#x7C;bn]"."""
    words = record.split(" ")
    count = next((k for k, word in enumerate(words) if not word.startswith("-")), len(words))
    names = ", ".join(f"`{word.rstrip(',')}`" for word in words[:count])
    return " ".join([names, _cell(" ".join(words[count:]))]).strip()


def options_markdown(command: click.Command, ctx: click.Context) -> str:
    """``command``'s options (in its context ``ctx``) as markdown, a table per section (docs/cli.md)."""
    parts = []
    for name, records in sectioned(command, ctx):
        rows = "\n".join(f"| {_flags(flags)} | {_cell(text)} |" for flags, text in records)
        parts.append(f"#### {name} options\n\n| Option | Description |\n| ------ | ----------- |\n{rows}\n")
    return "\n".join(parts)
