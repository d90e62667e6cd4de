"""`hasfl-ray data inspect`: a dataset's partition, capacity tiers and ground-truth heterogeneity, without training."""

from __future__ import annotations

import json
from typing import Any, Dict

import click

from hasfl_ray.cli.common import user_errors
from hasfl_ray.data import DATASETS


def partition_summary(dataset_name: str, data_dir: str | None, download: bool, clients: int, alpha: float,
                      seed: int) -> Dict[str, Any]:
    """The partition a run with these settings trains on: per client its name, n_i, p_max, TV distance
    and label histogram, plus the class count and the train and test sizes."""
    from hasfl_ray.data import load_dataset
    from hasfl_ray.engine.engine import capacity_tiers

    dataset = load_dataset(dataset_name, clients, alpha, seed, data_dir, download)
    p_max = capacity_tiers(seed, dataset.num_clients)  # Engine.prepare's draw: the p_max of the run
    histograms = dataset.label_histograms()
    tv = dataset.tv_distances()
    rows = [{"client": i, "name": dataset.client_names[i], "num_samples": dataset.client_size(i),
             "p_max": float(p_max[i]), "tv_distance": float(tv[i]), "label_histogram": histograms[i].tolist()}
            for i in range(dataset.num_clients)]
    return {"dataset": dataset_name, "num_classes": dataset.num_classes, "train_size": dataset.train_size,
            "test_size": dataset.test_size, "seed": seed, "alpha": alpha, "clients": rows}


@click.group()
def data() -> None:
    """Inspect datasets and their federated partitions."""


@data.command()
@click.option("--dataset", "dataset_name", type=click.Choice(DATASETS), default="digits", show_default=True,
              help="Which dataset.")
@click.option("--data-dir", type=click.Path(), help="A torchvision root (emnist, cifar10); LEAF JSON, a folder of "
              "per-play texts or one play text (shakespeare). Default: ./data.")
@click.option("--download", is_flag=True, help="Download the dataset if it is missing (never otherwise).")
@click.option("--clients", type=click.IntRange(min=1), default=20, show_default=True, help="Number of clients N.")
@click.option("--alpha", type=click.FloatRange(min=0, min_open=True), default=0.3, show_default=True,
              help="Dirichlet label-skew concentration (image sets).")
@click.option("--seed", type=click.IntRange(min=0), default=42, show_default=True,
              help="Run seed: redraws the partition and the capacity tiers.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: num_classes, train_size, test_size, "
              "clients (a list).")
@user_errors
def inspect(dataset_name: str, data_dir: str | None, download: bool, clients: int, alpha: float, seed: int,
            as_json: bool) -> None:
    """Print the partition: per client its name, num_samples, p_max, tv_distance and label histogram."""
    summary = partition_summary(dataset_name, data_dir, download, clients, alpha, seed)
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(f"{dataset_name}: {summary['num_classes']} classes, {summary['train_size']:,} train and "
               f"{summary['test_size']:,} test samples over {len(summary['clients'])} clients (seed {seed})")
    width = max(len("name"), *(len(row["name"]) for row in summary["clients"]))
    click.echo(f"{'client':>6}  {'name':<{width}}  {'num_samples':>11}  {'p_max':>5}  {'tv_distance':>11}  "
               "label_histogram")
    for row in summary["clients"]:
        histogram = " ".join(str(count) for count in row["label_histogram"])
        click.echo(f"{row['client']:>6}  {row['name']:<{width}}  {row['num_samples']:>11,}  {row['p_max']:>5.2f}  "
                   f"{row['tv_distance']:>11.4f}  {histogram}")
