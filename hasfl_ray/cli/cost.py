"""`hasfl-ray cost`: parameters, MACs per sample and upload size of a model at the paper's widths."""

from __future__ import annotations

import json

import click

from hasfl_ray.models import cost_table, resnet_cost_table

COST_MODELS = ("cifar10", "emnist", "shakespeare", "digits", "synthetic")
#: The ResNets (docs/models.md), costed on a built-in image dataset's inputs and classes.
RESNET_MODELS = ("preresnet18", "resnet18")
IMAGE_DATASETS = ("cifar10", "emnist", "digits")


@click.command()
@click.option("--model", "model_name", type=click.Choice(COST_MODELS + RESNET_MODELS), required=True,
              help="Which model's cost table to print: a dataset's own model, or preresnet18 / resnet18.")
@click.option("--dataset", type=click.Choice(IMAGE_DATASETS), default="cifar10", show_default=True,
              help="preresnet18 / resnet18: the image dataset whose input shape and classes they are costed on.")
@click.option("--model-norm", type=click.Choice(["sbn", "bn", "gn", "none"]), default=None,
              help="preresnet18 / resnet18: the normalisation (default sbn; none has no norm parameters).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {p, params, macs, upload_mb} "
                                                      "(and flops for the ResNets).")
def cost(model_name: str, dataset: str, model_norm: str | None, as_json: bool) -> None:
    """Print params, MACs per sample and fp32 upload MB at p = 0.25, 0.5, 0.75, 1 (the paper's Table 2); for
    preresnet18 and resnet18, at HeteroFL's levels a-e (p = 1, 1/2, 1/4, 1/8, 1/16) with FLOPs too."""
    resnet = model_name in RESNET_MODELS
    if not resnet and model_norm is not None:
        raise click.UsageError(f"--model-norm is {model_norm!r} but --model is {model_name!r}; expected it only "
                               f"with {' or '.join(RESNET_MODELS)}")
    rows = resnet_cost_table(model_name, dataset, norm=model_norm) if resnet else cost_table(model_name)
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not resnet:
        click.echo(f"{'p':>5} {'params':>12} {'MACs/sample':>14} {'upload MB':>10}")
        for row in rows:
            click.echo(f"{row['p']:>5.2f} {row['params']:>12,} {row['macs']:>14,} {row['upload_mb']:>10.2f}")
        return
    click.echo(f"{'p':>7} {'params':>12} {'MACs/sample':>14} {'FLOPs/sample':>14} {'upload MB':>10}")
    for row in rows:
        click.echo(f"{row['p']:>7.4g} {row['params']:>12,} {row['macs']:>14,} {row['flops']:>14,} "
                   f"{row['upload_mb']:>10.2f}")
