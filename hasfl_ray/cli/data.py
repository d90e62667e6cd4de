"""`hasfl-ray data inspect`: a dataset's partition, capacity tiers and ground-truth heterogeneity, without training."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Dict

import click

from hasfl_ray.cli.common import user_errors
from hasfl_ray.cli.options import PARTITION_HELP, apply_switches
from hasfl_ray.data import DATASETS


def partition_summary(dataset_name: str, data_dir: str | None, download: bool, clients: int, alpha: float,
                      seed: int, partition: str = "dirichlet", widths: Any = None,
                      width_mix: Any = None, tier_counts: Any = None) -> Dict[str, Any]:
    """The partition a run with these settings trains on: per client its name, n_i, p_max, TV distance
    and label histogram, plus the class count, the train and test sizes and the partition scheme (``partition``:
    dirichlet, iid, classes:K, classes-even:K, shards:S; with classes:K also each client's label split and the size
    of its own test shard; ``widths`` and ``width_mix``: the width ladder p_max is dealt from; ``tier_counts``: the
    clients of each width, as a run's ``tier_counts``)."""
    from hasfl_ray.data import load_dataset, load_plugin_dataset
    from hasfl_ray.engine.engine import capacity_tiers
    from hasfl_ray.federation import ladder_of, normalise_partition
    from hasfl_ray.registry import is_spec, lookup

    partition = normalise_partition(partition)
    ladder = ladder_of(SimpleNamespace(widths=widths, width_mix=width_mix))
    if is_spec(dataset_name):  # a plug-in loads from the resolved config simulate would give it (docs/plugins.md)
        from hasfl_ray.config import RunConfig

        config = RunConfig.from_dict({"dataset": dataset_name, "clients": clients, "clients_per_round": 1,
                                      "alpha": alpha, "seed": seed, "data_dir": data_dir, "download": download,
                                      "partition": partition}, "data inspect").resolved()
        dataset = load_plugin_dataset(lookup("dataset", dataset_name), config)
    else:
        dataset = load_dataset(dataset_name, clients, alpha, seed, data_dir, download, partition=partition)
    p_max = capacity_tiers(seed, dataset.num_clients, tier_counts, ladder)  # Engine.prepare's draw: the run's p_max
    histograms = dataset.label_histograms()
    tv = dataset.tv_distances()
    rows = [{"client": i, "name": dataset.client_names[i], "num_samples": dataset.client_size(i),
             "p_max": float(p_max[i]), "tv_distance": float(tv[i]), "label_histogram": histograms[i].tolist()}
            for i in range(dataset.num_clients)]
    labels, tests = getattr(dataset, "label_split", None), getattr(dataset, "client_test_indices", None)
    if labels is not None and tests is not None:  # classes:K: each client's labels and its own test shard
        for row, held, test in zip(rows, labels, tests):
            row.update(label_split=list(held), test_samples=int(len(test)))
    return {"dataset": dataset_name, "num_classes": dataset.num_classes, "train_size": dataset.train_size,
            "test_size": dataset.test_size, "seed": seed, "alpha": alpha, "partition": partition,
            "partition_rule": partition_rule(dataset_name, partition, alpha), "clients": rows}


def partition_rule(dataset_name: str, partition: str, alpha: float) -> str:
    """One phrase saying how the clients' data were split (``data inspect``'s header and JSON)."""
    from hasfl_ray.federation import parse_partition
    from hasfl_ray.registry import lookup

    if not getattr(lookup("dataset", dataset_name), "label_partitions", False):
        return "the dataset's own clients (no label partition applies)"
    scheme, k = parse_partition(partition)
    if scheme.startswith("flwr:"):
        from hasfl_ray.data.flower import flwr_rule

        return flwr_rule(scheme)
    return {"dirichlet": f"Dirichlet label skew, alpha {alpha:g}",
            "balanced-dirichlet": f"FIARSE's balanced Dirichlet: label proportions Dirichlet(alpha {alpha:g}) a client, "
                                  "equal client sizes",
            "iid": "IID: one shuffle cut into equal parts",
            "classes": f"HeteroFL's non-IID-{k}: {k}·N/C shards of each class, a shuffled label split of {k} labels "
                       "a client (a repeated label held once), the test set split with the same label split",
            "classes-even": f"{k} classes per client, each class's samples split evenly over its holders",
            "shards": f"{k} label-sorted shards per client (McMahan et al.)"}[scheme]


def check_given_keys(context: click.Context, dataset_name: str, alpha: float, partition: str) -> None:
    """Refuse, in simulate's sentence (``check_inert_keys``), an ``--alpha`` or ``--partition`` the user gave that
    the partition or dataset does not read (``--alpha 0.1 --partition iid``): its defaults are never refused."""
    from click.core import ParameterSource

    from hasfl_ray.config import check_inert_keys

    given = {name: value for name, value in (("alpha", alpha), ("partition", partition))
             if context.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}
    check_inert_keys(given, {"dataset": dataset_name, "alpha": alpha, "partition": partition})


@click.group()
def data() -> None:
    """Inspect datasets and their federated partitions."""


@data.command()
@click.option("--dataset", "dataset_name", default="digits", show_default=True, metavar="NAME|FILE.py:Class",
              help=f"Which dataset: {', '.join(DATASETS)}, hf:PATH_OR_NAME (a Hugging Face image dataset, "
                   "docs/datasets.md#hub), or a plug-in FILE.py:Class / MODULE:Class "
                   "(docs/plugins.md#datasets), loaded as simulate loads it.")
@click.option("--data-dir", type=click.Path(), help="A torchvision root (emnist, cifar10, cifar100); LEAF JSON, a "
              "folder of per-play texts or one play text (shakespeare). Default: ./data.")
@click.option("--download", is_flag=True, help="Download the dataset if it is missing (never otherwise).")
@click.option("--clients", type=click.IntRange(min=1), default=20, show_default=True, help="Number of clients N.")
@click.option("--alpha", type=click.FloatRange(min=0, min_open=True), default=0.3, show_default=True,
              help="Dirichlet label-skew concentration (image sets).")
@click.option("--seed", type=click.IntRange(min=0), default=42, show_default=True,
              help="Run seed: redraws the partition and the capacity tiers (unless --data-seed is given).")
@click.option("--data-seed", type=click.IntRange(min=0), default=None,
              help="The data seed of a run (simulate's --data-seed): the partition and the capacity tiers "
                   "(default: --seed).")
@click.option("--partition", default="dirichlet", show_default=True, metavar="SCHEME",
              help=PARTITION_HELP.format(default="") + ".")
@click.option("--widths", metavar="W1,W2,...", help="The width ladder p_max is dealt from (default: the paper's "
              "tiers 0.25,0.5,0.75,1), as simulate's --widths.")
@click.option("--width-mix", metavar="MIX", help="Each width's share, or HeteroFL's a1-b1-c1-d1-e1, as simulate's "
              "--width-mix.")
@click.option("--tier-counts", metavar="N1,N2,...", help="Clients per width of the ladder (default: dealt by the "
              "mix), as simulate's --tier-counts.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: num_classes, train_size, test_size, "
              "clients (a list).")
@click.option("--plot", "plot_file", metavar="FILE.png|FILE.pdf|FILE.svg",
              help="Also draw the clients x labels heat map of training samples into FILE (its format by extension).")
@user_errors
def inspect(dataset_name: str, data_dir: str | None, download: bool, clients: int, alpha: float, seed: int,
            data_seed: int | None, partition: str, widths: str | None, width_mix: str | None,
            tier_counts: str | None, as_json: bool, plot_file: str | None) -> None:
    """Print the partition: per client its name, num_samples, p_max, tv_distance and label histogram (with
    classes:K also its labels and the size of its own test shard)."""
    from hasfl_ray.registry import is_spec, lookup

    if not is_spec(dataset_name):
        lookup("dataset", dataset_name)  # one sentence, with the nearest name, for one that is not known
    check_given_keys(click.get_current_context(), dataset_name, alpha, partition)
    if plot_file is not None:  # a name it cannot write is refused before the data loads
        from hasfl_ray.analysis.partition_plot import check_plot_path

        check_plot_path(plot_file)
    flags: Dict[str, Any] = {"widths": widths, "tier_counts": tier_counts}
    apply_switches(flags, False, False, False)  # --widths and --tier-counts as simulate reads them
    if flags["tier_counts"] is not None:  # checked as a run checks them: one count per width, adding up to clients
        from hasfl_ray.config import RunConfig

        RunConfig.from_dict({"clients": clients, "clients_per_round": 1, "tier_counts": flags["tier_counts"],
                             "widths": flags["widths"], "width_mix": width_mix}, "data inspect")
    seed = seed if data_seed is None else data_seed  # what a run draws its data from (RunConfig.effective_data_seed)
    summary = partition_summary(dataset_name, data_dir, download, clients, alpha, seed, partition, flags["widths"],
                                width_mix, flags["tier_counts"])
    from types import SimpleNamespace

    from hasfl_ray.federation import empty_level_note

    note = empty_level_note(SimpleNamespace(widths=flags["widths"], width_mix=width_mix, width_assignment="fixed",
                                            clients=len(summary["clients"]), tier_counts=flags["tier_counts"]))
    if note is not None:  # as a run says it at its start (on stderr: --json's line stays the only one on stdout)
        click.echo(f"warning: {note}", err=True)
    if plot_file is not None:
        from hasfl_ray.analysis.partition_plot import plot_partition

        plot_partition(summary, plot_file, f"{dataset_name}: partition {summary['partition']}, "
                                           f"{len(summary['clients'])} clients, seed {seed}")
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(f"{dataset_name}: {summary['num_classes']} classes, {summary['train_size']:,} train and "
               f"{summary['test_size']:,} test samples over {len(summary['clients'])} clients (seed {seed}); "
               f"partition {summary['partition']}: {summary['partition_rule']}")
    width = max(len("name"), *(len(row["name"]) for row in summary["clients"]))
    split = "label_split" in summary["clients"][0]
    click.echo(f"{'client':>6}  {'name':<{width}}  {'num_samples':>11}  {'p_max':>6}  {'tv_distance':>11}  "
               + (f"{'labels':<11}  {'test_shard':>10}  " if split else "") + "label_histogram")
    for row in summary["clients"]:
        histogram = " ".join(str(count) for count in row["label_histogram"])
        held = (f"{','.join(map(str, row['label_split'])):<11}  {row['test_samples']:>10,}  " if split else "")
        click.echo(f"{row['client']:>6}  {row['name']:<{width}}  {row['num_samples']:>11,}  {row['p_max']:>6.4g}  "
                   f"{row['tv_distance']:>11.4f}  {held}{histogram}")
