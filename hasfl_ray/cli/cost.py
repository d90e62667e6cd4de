"""`hasfl-ray cost`: parameters, MACs per sample and upload size of a model at the paper's widths or any others,
for the built-in models, the ResNets and plug-in models (docs/usage.md#cost, docs/plugins.md#models)."""

from __future__ import annotations

import json
import shlex
from typing import List, Optional, Sequence

import click

from hasfl_ray.cli.common import user_errors
from hasfl_ray.cli.options import apply_switches
from hasfl_ray.data import DATASETS
from hasfl_ray.errors import ConfigError, expected_one_of
from hasfl_ray.federation import normalise_ladder
from hasfl_ray.models import cost_table, resnet_cost_table
from hasfl_ray.registry import is_spec

COST_MODELS = ("cifar10", "cifar100", "emnist", "shakespeare", "digits", "synthetic")
#: The ResNets (docs/models.md), costed on a built-in image dataset's inputs and classes; preresnet18-1112 is
#: HeteroFL's published (1, 1, 1, 2) network.
RESNET_MODELS = ("preresnet18", "resnet18", "preresnet18-1112")
IMAGE_DATASETS = ("cifar10", "cifar100", "emnist", "digits")
#: The widths a plug-in model is costed at without --widths: the paper's four (Table 2).
PLUGIN_WIDTHS = (0.25, 0.5, 0.75, 1.0)


def parse_widths(text: Optional[str]) -> Optional[List[float]]:
    """``--widths`` as `simulate` reads it (a comma list of distinct widths in (0, 1]), or None when not given; one
    ConfigError sentence otherwise."""
    if text is None:
        return None
    flags = {"widths": text}
    apply_switches(flags, False, False, False)  # the comma list, as simulate and `data inspect` parse it
    widths, _ = normalise_ladder(flags["widths"], None)  # the width ladder's checks: (0, 1], distinct
    return widths


def plugin_cost_table(spec: str, dataset: str, data_dir: Optional[str] = None,
                      widths: Sequence[float] = PLUGIN_WIDTHS) -> List[dict]:
    """:func:`~hasfl_ray.models.cost_table` of plug-in model ``spec`` (``FILE.py:Class`` / ``MODULE:Class``) built for
    the inputs and classes of built-in dataset ``dataset``, as `simulate --model` builds it (the dataset loaded, then
    :func:`~hasfl_ray.models.choice.model_dataset`): parameters from its slice description (derived or its own
    ``param_specs()``), MACs per sample its own ``macs(p)`` or, without one, torch's FlopCounterMode on a forward
    pass at each width (matrix multiplications and convolutions only), and FLOPs per sample 2 x MACs (unless it
    has a ``flops(p)`` method)."""
    from hasfl_ray.data import load_plugin_dataset
    from hasfl_ray.config import RunConfig
    from hasfl_ray.errors import DataError
    from hasfl_ray.models.choice import model_dataset
    from hasfl_ray.registry import lookup, spec_label

    config = RunConfig(dataset=dataset, data_dir=data_dir, model=spec)
    try:
        loaded = load_plugin_dataset(lookup("dataset", dataset), config)
    except DataError as error:  # the loaders offer ", or --download", a flag cost does not have
        if ", or --download" not in str(error):
            raise
        where = f" --data-dir {shlex.quote(data_dir)}" if data_dir else ""
        fetch = f", or `hasfl-ray data inspect --dataset {dataset}{where} --download` first"
        raise DataError(str(error).replace(", or --download", fetch, 1)) from None
    adopted = model_dataset(loaded, config, spec_label(dataset))
    rows = cost_table(adopted.model, tuple(widths))
    for row in rows:
        row.setdefault("flops", 2 * row["macs"])
    return rows


@click.command()
@click.option("--model", "model_name", metavar="MODEL|FILE.py:Class|MODULE:Class", required=True,
              help="Which model's cost table to print: a dataset's own model (cifar10, cifar100, emnist, shakespeare, "
                   "digits, synthetic), preresnet18 / resnet18 / preresnet18-1112 (HeteroFL's published network), or a "
                   "plug-in model, any nn.Module taking a width argument, as simulate's --model takes it "
                   "(docs/plugins.md#models).")
@click.option("--dataset", type=click.Choice(DATASETS), default=None,
              help="The ResNets: the image dataset (cifar10, cifar100, emnist, digits) whose input shape and classes "
                   "they are costed on; a plug-in model: the built-in dataset it is built for, loaded as simulate "
                   "loads it (--data-dir). Default cifar10; not with a dataset's own model.")
@click.option("--data-dir", type=click.Path(),
              help="A plug-in model: where --dataset lives, as simulate's --data-dir (digits and synthetic need none).")
@click.option("--model-norm", type=click.Choice(["sbn", "bn", "gn", "none"]), default=None,
              help="The ResNets: the normalisation (default sbn; none has no norm parameters).")
@click.option("--widths", metavar="W1,W2,...",
              help="The widths to cost, comma-separated in (0, 1], as simulate's --widths, e.g. "
                   "1,0.5,0.25,0.125,0.0625 (default: 0.25,0.5,0.75,1; HeteroFL's levels a-e for the ResNets).")
@click.option("--depths", metavar="D1,D2,...",
              help="Price depth sub-models (docs/models.md#depth-sub-models): the model with an exit after every "
                   "stage, one row per depth and width (its first D stages and exits 1..D: parameters, MACs and "
                   "FLOPs per sample of its training forward, every exit counted, and upload MB). The ResNets and the "
                   "image CNNs (cifar10, cifar100, emnist, digits).")
@click.option("--index-sets", is_flag=True,
              help="Add what a client holding channel index sets (FLuID's sub-models, docs/models.md#channel-index-"
                   "sets) uploads at each width: its held values (4 bytes each, the params column) plus its index "
                   "lists, one int64 per kept position of every scaled dim (upload+index MB: the two together; the "
                   "lists go down too). Its MACs are the width-p network's: it trains a network of those shapes.")
@click.option("--algorithm", metavar="NAME", default=None,
              help="Price a method's sub-models: fiarse or fedgmr (parameter masks: the full network's MACs, the held "
                   "values and the bitmask's bytes, docs/clock.md); depthfl (the full width up to each size's depth) "
                   "or scalefl (the size's width up to its level's exit), exits included, --depths one depth per "
                   "size in --widths order, as simulate pairs them (default ceil(size x stages): 1,2,3,4 on a ResNet); fluid adds --index-sets' columns (a "
                   "straggler of width p < 1 moves its index lists; at p = 1 none); fedavg, fedprox and scaffold "
                   "(the whole model at every size) and uniform (width min(0.5, size)) print each size beside the "
                   "width it trains; any other built-in trains the width-p slice this table prices without it "
                   "(docs/algorithms.md).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {p, params, macs, upload_mb} "
                                                      "(and flops for the ResNets and plug-in models).")
@user_errors
def cost(model_name: str, dataset: str, data_dir: Optional[str], model_norm: Optional[str], widths: Optional[str],
         depths: Optional[str], index_sets: bool, algorithm: Optional[str], as_json: bool) -> None:
    """Print params, MACs per sample and fp32 upload MB at p = 0.25, 0.5, 0.75, 1 (the paper's Table 2) or at
    --widths; for the ResNets (preresnet18, resnet18, preresnet18-1112), at HeteroFL's levels a-e (p = 1, 1/2, 1/4,
    1/8, 1/16) with FLOPs too, as HeteroFL's own counter counts them (src/summary.py; docs/models.md#costs).

    A plug-in model (--model FILE.py:Class) is built for --dataset's inputs and classes as simulate builds it; its
    parameters come from its slice description, its MACs per sample from its own macs(p) or else from torch's
    FlopCounterMode on one forward pass at each width, which counts matrix multiplications and convolutions only
    (no norms, activations, softmax or additions); FLOPs = 2 x MACs."""
    ladder = parse_widths(widths)
    plugin = is_spec(model_name)
    resnet = model_name in RESNET_MODELS
    if not plugin and not resnet and model_name not in COST_MODELS:
        raise click.UsageError(f"--model is {model_name!r}; " + expected_one_of(
            model_name, [*COST_MODELS, *RESNET_MODELS, "a plug-in"]))
    if not resnet and model_norm is not None:
        raise click.UsageError(f"--model-norm is {model_norm!r} but --model is {model_name!r}; expected it only "
                               f"with a ResNet ({', '.join(RESNET_MODELS)})")
    if not resnet and not plugin and dataset not in (None, model_name):  # never dropped in silence
        raise click.UsageError(f"--dataset is {dataset!r} but --model {model_name!r} is a dataset's own model, costed "
                               "on its inputs; expected --dataset only with a ResNet or a plug-in model")
    if not plugin and data_dir is not None:
        raise click.UsageError(f"--data-dir is {data_dir!r} but --model {model_name!r} is built-in, costed without "
                               "reading data; expected --data-dir only with a plug-in model")
    dataset = dataset or "cifar10"
    if resnet and dataset not in IMAGE_DATASETS:
        raise click.UsageError(f"--dataset is {dataset!r} but --model is {model_name!r}; expected an image dataset, "
                               f"one of {', '.join(IMAGE_DATASETS)}")
    chosen = {} if ladder is None else {"widths": tuple(ladder)}
    check_shapes(algorithm, depths, index_sets)
    if algorithm is not None and mask_method(algorithm, plugin, depths):
        click.echo(mask_output(model_name, dataset, model_norm, ladder, algorithm, as_json))
        return
    if depths is not None or algorithm in DEPTH_ALGORITHMS:
        if algorithm is not None and trained_widths(algorithm, [1.0]) is not None:  # the depth rows ignored it
            raise ConfigError(f"--depths is {depths!r} with --algorithm {algorithm}, whose clients train another "
                              "width than their size's; expected --depths alone, or with a method that trains each "
                              "size's own width (depthfl, scalefl, hasfl, heterofl, ...)")
        rows = algorithm_rows(algorithm, model_name, dataset, model_norm, depths, ladder) \
            if algorithm in DEPTH_ALGORITHMS else depth_rows(model_name, dataset, model_norm, depths, ladder)
        if as_json:
            click.echo(json.dumps(rows))
            return
        sized = algorithm in DEPTH_ALGORITHMS  # a method's rows name their size; --depths alone's do not
        click.echo((f"{'size':>7} " if sized else "") + f"{'depth':>5} {'p':>7} {'params':>12} {'MACs/sample':>14} "
                   f"{'FLOPs/sample':>14} {'upload MB':>10}")
        for row in rows:
            click.echo((f"{row['size']:>7g} " if sized else "") + f"{row['depth']:>5} {row['p']:>7g} "
                       f"{row['params']:>12,} {row['macs']:>14,} {row['flops']:>14,} {row['upload_mb']:>10.2f}")
        return
    def table(**widths) -> List[dict]:
        if plugin:
            return plugin_cost_table(model_name, dataset, data_dir, **widths)
        if resnet:
            return resnet_cost_table(model_name, dataset, norm=model_norm, **widths)
        return cost_table(model_name, **widths)

    rows = table(**chosen)
    trained = None if algorithm is None else trained_widths(algorithm, [row["p"] for row in rows])
    if trained is not None:  # FedAvg's (whole model) and Uniform's (min(0.5, size)) clients train another width
        rows = [{"size": row["p"], **priced} for row, priced in zip(rows, table(widths=tuple(trained)))]
    lead = (lambda row: f"{row['size']:>7g} ") if trained is not None else (lambda row: "")
    head = f"{'size':>7} " if trained is not None else ""
    if algorithm == "fluid":  # its stragglers train channel index sets and the clock charges their lists
        index_sets = True
    if index_sets:
        add_index_bytes(rows, model_name, dataset, model_norm, plugin, whole_at_one=algorithm == "fluid",
                        label="--algorithm fluid" if algorithm == "fluid" else "--index-sets")
    if as_json:
        click.echo(json.dumps(rows))
        return
    index = (lambda row: f" {row['index_upload_mb']:>15.2f}") if index_sets else (lambda row: "")
    if "flops" not in rows[0] and all(round(row["p"], 2) == row["p"] for row in rows):
        click.echo(head + f"{'p':>5} {'params':>12} {'MACs/sample':>14} {'upload MB':>10}"
                   + (f" {'upload+index MB':>15}" if index_sets else ""))
        for row in rows:
            click.echo(lead(row) + f"{row['p']:>5.2f} {row['params']:>12,} {row['macs']:>14,} "
                       f"{row['upload_mb']:>10.2f}" + index(row))
        return
    flops, width = "flops" in rows[0], max(7, *(len(f"{row['p']:g}") for row in rows))
    click.echo(head + f"{'p':>{width}} {'params':>12} {'MACs/sample':>14}"
               + (f" {'FLOPs/sample':>14}" if flops else "")
               + f" {'upload MB':>10}" + (f" {'upload+index MB':>15}" if index_sets else ""))
    for row in rows:
        click.echo(lead(row) + f"{row['p']:>{width}g} {row['params']:>12,} {row['macs']:>14,}"
                   + (f" {row['flops']:>14,}" if flops else "") + f" {row['upload_mb']:>10.2f}" + index(row))


def add_index_bytes(rows: List[dict], model_name: str, dataset: str, norm: Optional[str], plugin: bool,
                    whole_at_one: bool = False, label: str = "--index-sets") -> None:
    """``--index-sets``: each row's ``index_bytes`` (the int64 index lists, :func:`hasfl_ray.clock.cost.
    index_list_bytes`) and ``index_upload_mb`` (held values plus those lists); one sentence for a model without
    channel groups (the LSTM, a plug-in). ``whole_at_one``: a client of width 1 holds the whole model and moves no
    lists (FLuID's non-stragglers, whose ``channel_sets`` is None)."""
    from hasfl_ray.clock.cost import index_bytes_of
    from hasfl_ray.errors import ConfigError
    from hasfl_ray.models import build_model
    from hasfl_ray.models.index_slicing import channel_groups

    if plugin:
        raise ConfigError(f"{label} with --model {model_name!r}; expected a built-in model or a ResNet (a "
                          "plug-in model's channel groups are not known here)")
    name = model_name
    if model_name in RESNET_MODELS:
        name = resnet_on(model_name, dataset, norm)
    specs = build_model(name).param_specs()
    try:
        channel_groups(specs)
    except ValueError:
        raise ConfigError(f"{label} with --model {model_name!r}; expected a model of channel groups (an image "
                          "CNN, an MLP or a ResNet), not a recurrent one") from None
    for row in rows:
        row["index_bytes"] = 0 if whole_at_one and row["p"] >= 1 else index_bytes_of(specs, row["p"])
        row["index_upload_mb"] = (4 * row["params"] + row["index_bytes"]) / 1e6


def resnet_on(model_name: str, dataset: str, norm: Optional[str], head: Optional[str] = None) -> str:
    """The registered name of ResNet ``model_name`` on built-in image dataset ``dataset``'s inputs and classes; with
    ``head``, built with exits whose heads are ``head`` (:mod:`hasfl_ray.models.depth_heads`)."""
    from hasfl_ray.models import MODEL_CONFIGS, register_model
    from hasfl_ray.models.depth_heads import with_exit_heads
    from hasfl_ray.models.resnet import resnet_config

    config = MODEL_CONFIGS[dataset]
    name, built = resnet_config(model_name, config["in_channels"], config["num_classes"], config["image_size"], norm)
    name, built = (name, built) if head is None else with_exit_heads(name, built, head)
    register_model(name, built)
    return name


def depth_rows(model_name: str, dataset: str, norm: Optional[str], depths: str,
               ladder: Optional[List[float]]) -> List[dict]:
    """:func:`~hasfl_ray.models.depth.depth_cost_table` of ``model_name`` with exits at ``depths`` (a comma list)
    and ``ladder`` (default width 1): a ResNet on ``dataset``'s images, or a built-in image CNN; one ConfigError
    sentence for a depth the model lacks or a model without stages."""
    from hasfl_ray.errors import ConfigError
    from hasfl_ray.models import depth_cost_table

    try:
        chosen = [int(part) for part in depths.split(",")]
    except ValueError:
        raise ConfigError(f"--depths is {depths!r}; expected a comma list of depths, e.g. 1,2,3,4") from None
    name = exits_model(model_name, dataset, norm, f"--depths is {depths!r}")
    try:
        return depth_cost_table(name, chosen, tuple(ladder or (1.0,)))
    except ValueError as error:
        raise ConfigError(f"--depths is {depths!r}: {error}") from None


def exits_model(model_name: str, dataset: str, norm: Optional[str], what: str, head: str = "depthfl") -> str:
    """The registered name of ``model_name`` built with exits (a ResNet on ``dataset``'s images, its exits' heads
    ``head``: :mod:`hasfl_ray.models.depth_heads`; or a built-in image CNN); one ConfigError sentence, opened by
    ``what``, for a model without stages."""
    from hasfl_ray.errors import ConfigError
    from hasfl_ray.models import MODEL_CONFIGS, register_model

    if model_name in RESNET_MODELS:
        return resnet_on(model_name, dataset, norm, head)
    if MODEL_CONFIGS.get(model_name, {}).get("kind") != "cnn":
        raise ConfigError(f"{what} but --model {model_name!r} has no stages with exits; expected a "
                          f"ResNet ({', '.join(RESNET_MODELS)}) or an image CNN ({', '.join(IMAGE_DATASETS)})")
    register_model(f"{model_name}+exits", {**MODEL_CONFIGS[model_name], "exits": True})
    return f"{model_name}+exits"


def algorithm_rows(algorithm: str, model_name: str, dataset: str, norm: Optional[str], depths: Optional[str],
                   ladder: Optional[List[float]]) -> List[dict]:
    """One row per size of ``ladder`` (default 0.25, 0.5, 0.75, 1) of what a client of that size trains and sends
    under ``algorithm``: DepthFL, the full-width network up to its depth (``depths``, one per size, else ceil(size x
    stages), as simulate's depth plan); ScaleFL, the size's width up to its level's exit (``depths`` the levels'
    exits, default likewise: the source's 1,2,3,4 on a ResNet; a ResNet's exits the source's heads). Each row: the
    size, the width and depth trained, params, MACs and FLOPs per sample of its training forward (every exit up to
    its depth counted) and upload MB (fp32)."""
    from hasfl_ray.errors import ConfigError
    from hasfl_ray.models import build_model, depth_cost_table
    from hasfl_ray.models.depth import exit_depths
    from hasfl_ray.models.depth_plan import ladder_depths

    given = list(ladder or PLUGIN_WIDTHS)
    name = exits_model(model_name, dataset, norm, f"--algorithm is {algorithm!r}",  # scalefl_exit_head's default
                       "scalefl" if algorithm == "scalefl" else "depthfl")
    total = exit_depths(build_model(name))
    listed = None
    if depths is not None:
        try:
            listed = [int(part) for part in depths.split(",")]
        except ValueError:
            listed = []
    if listed is not None and (len(listed) != len(given) or any(not 1 <= d <= total for d in listed)):
        raise ConfigError(f"--depths is {depths!r} for --algorithm {algorithm} but model {model_name!r} has {total} "
                          f"depths and the sizes are {', '.join(f'{w:g}' for w in given)}; expected one depth from 1 "
                          f"to {total} per size")
    if algorithm == "scalefl" and listed:  # a wider level exiting earlier: refused by a run too
        from hasfl_ray.algorithms.scalefl import check_levels

        check_levels(given, listed, f"--depths is {depths!r} for --algorithm scalefl")
    sizes, chosen = ladder_depths(given, listed, total)  # one depth per size in --widths order, as a run pairs them
    rows = []
    for size, depth in zip(sizes, chosen):
        trained = 1.0 if algorithm == "depthfl" else size
        row = depth_cost_table(name, [depth], (trained,))[0]
        rows.append({"algorithm": algorithm, "size": size, **row})
    return rows


def trained_widths(algorithm: str, sizes: List[float]) -> Optional[List[float]]:
    """The width a client of each size trains under a built-in whose rule does not train the size's own slice:
    FedAvg, FedProx and SCAFFOLD the whole model (``capacity_allocation``: 1 for everyone), Uniform min(0.5, size)
    (``UNIFORM_WIDTH``); None for the others (the slice of the size, or masks and depths priced elsewhere)."""
    from hasfl_ray.algorithms import algorithm_class
    from hasfl_ray.algorithms.fullmodel import FedAvg
    from hasfl_ray.algorithms.uniform import UNIFORM_WIDTH, Uniform

    chosen = algorithm_class(algorithm)
    if issubclass(chosen, FedAvg):
        return [1.0] * len(sizes)
    if issubclass(chosen, Uniform):
        return [min(UNIFORM_WIDTH, size) for size in sizes]
    return None


#: The methods whose clients train depth sub-models (``hasfl-ray cost --algorithm``).
DEPTH_ALGORITHMS = ("depthfl", "scalefl")

#: The methods whose clients hold parameter masks (``hasfl-ray cost --algorithm``).
MASK_ALGORITHMS = ("fiarse", "fedgmr")


def check_shapes(algorithm: Optional[str], depths: Optional[str], index_sets: bool) -> None:
    """One sentence for sub-model shapes no run combines: FLuID's index sets with --depths (it trains width
    sub-models), --index-sets beside a method whose clients hold masks or depth sub-models."""
    from hasfl_ray.errors import ConfigError

    if algorithm == "fluid" and depths is not None:
        raise ConfigError(f"--depths is {depths!r} with --algorithm fluid; expected no --depths (FLuID's clients "
                          "train channel index sets of the whole network, sub_model width)")
    if index_sets and algorithm in MASK_ALGORITHMS + DEPTH_ALGORITHMS:
        held = "parameter masks" if algorithm in MASK_ALGORITHMS else "depth sub-models"
        raise ConfigError(f"--index-sets with --algorithm {algorithm}; expected it alone or with --algorithm fluid "
                          f"({algorithm}'s clients hold {held}, not channel index sets)")
    if index_sets and depths is not None:  # the depth table has no index columns: it was dropped in silence
        raise ConfigError(f"--index-sets with --depths {depths!r}; expected one of them (a run refuses channel sets "
                          "beside depth sub-models: one sub-model shape per client)")


def mask_method(algorithm: str, plugin: bool, depths: Optional[str]) -> bool:
    """Whether ``--algorithm`` prices masks (fiarse, fedgmr); another built-in's table is the slices'; one
    ConfigError sentence for an unknown name or a combination the mask table does not price."""
    from hasfl_ray.algorithms import ALGORITHMS
    from hasfl_ray.errors import ConfigError

    if algorithm not in ALGORITHMS and ":" in algorithm:  # FILE.py:Class or MODULE:Class, as simulate takes them
        raise ConfigError(f"--algorithm is {algorithm!r}, a plug-in, whose sub-models only its run knows (the device "
                          "clock prices them there); expected a built-in method's name, such as fiarse or fedgmr")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"--algorithm is {algorithm!r}; " + expected_one_of(algorithm, list(ALGORITHMS)))
    if algorithm not in MASK_ALGORITHMS:
        return False
    if plugin or depths is not None:
        raise ConfigError(f"--algorithm is {algorithm!r} with {'a plug-in --model' if plugin else '--depths'}; "
                          "expected a built-in model or a ResNet without --depths (its clients hold parameter masks "
                          "of the whole network)")
    return True


def mask_output(model_name: str, dataset: str, norm: Optional[str], ladder: Optional[List[float]], algorithm: str,
                as_json: bool) -> str:
    """The mask methods' cost table (:func:`hasfl_ray.algorithms.fiarse.mask_cost_table`) as text or JSON."""
    from hasfl_ray.algorithms.fiarse import mask_cost_table

    name, widths = model_name, ladder or ([1.0, 0.5, 0.25, 0.125] if model_name in RESNET_MODELS else
                                          list(PLUGIN_WIDTHS))
    if model_name in RESNET_MODELS:
        name = resnet_on(model_name, dataset, norm)
    from hasfl_ray.algorithms.league.fedgmr import kept_count

    # FedGMR's masks hold ceil(density x n) (its restore_mask), at their initial density p^2 in round 0
    rows = mask_cost_table(name, widths, kept=kept_count if algorithm == "fedgmr" else None, method=algorithm)
    if as_json:
        return json.dumps(rows)
    flops = "flops" in rows[0]
    size = "initial density" if algorithm == "fedgmr" else "size"
    lines = [f"{algorithm}: parameter masks ({size} = p^2 of the scored parameters; the full network's MACs)",
             f"{'p':>7} {'size':>9} {'params held':>12} {'MACs/sample':>14}" + (f" {'FLOPs/sample':>14}" if flops
                                                                                 else "")
             + f" {'bitmask KB':>10} {'upload MB':>10}"]
    for row in rows:
        lines.append(f"{row['p']:>7g} {row['size']:>9.6g} {row['params']:>12,} {row['macs']:>14,}"
                     + (f" {row['flops']:>14,}" if flops else "")
                     + f" {row['bitmask_bytes'] / 1e3:>10.2f} {row['upload_mb']:>10.2f}")
    return "\n".join(lines)
