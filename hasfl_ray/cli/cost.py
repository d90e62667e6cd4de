"""`hasfl-ray cost`: parameters, MACs per sample and upload size of a model at the paper's widths."""

from __future__ import annotations

import json

import click

from hasfl_ray.models import cost_table

COST_MODELS = ("cifar10", "emnist", "shakespeare", "digits", "synthetic")


@click.command()
@click.option("--model", "model_name", type=click.Choice(COST_MODELS), required=True,
              help="Which model's cost table to print.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {p, params, macs, upload_mb}.")
def cost(model_name: str, as_json: bool) -> None:
    """Print params, MACs per sample and fp32 upload MB at p = 0.25, 0.5, 0.75, 1 (the paper's Table 2)."""
    rows = cost_table(model_name)
    if as_json:
        click.echo(json.dumps(rows))
        return
    click.echo(f"{'p':>5} {'params':>12} {'MACs/sample':>14} {'upload MB':>10}")
    for row in rows:
        click.echo(f"{row['p']:>5.2f} {row['params']:>12,} {row['macs']:>14,} {row['upload_mb']:>10.2f}")
