"""Flower Datasets' partitioners as ``--partition flwr:...`` choices, and a fast natural-id grouping.

A ``flwr:`` partition is computed by flwr-datasets' own partitioner classes (``flwr_datasets.partitioner``) on a
``datasets.Dataset`` of the labels (and the natural-id column), seeded with the run's seed, so a Flower user's split
is exactly Flower's. ``flwr:natural_id:COLUMN`` is grouped here with one numpy sort (:func:`natural_id_partition`),
which gives exactly :class:`~flwr_datasets.partitioner.NaturalIdPartitioner`'s partitions (same client order: the
sorted distinct ids; same indices: ascending row order) in a fraction of its time (benchmarks/bench_natural_id.py).
"""

from __future__ import annotations

import warnings
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import FLWR_EXPECTED, FLWR_SCHEMES, is_flwr, normalise_flwr, parse_flwr  # noqa: F401

#: The sentence for a run asking for what the ``hub`` extra brings.
HUB_EXTRA = 'pip install ".[hub]"'


def require_hub(what: str) -> None:
    """Refuse, in one sentence naming the extra, ``what`` where ``datasets`` or ``flwr-datasets`` is not installed."""
    import importlib.util

    for module in ("datasets", "flwr_datasets"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"{what} needs the {module.replace('_', '-')} package, which is not installed; "
                              f"expected the hub extra: {HUB_EXTRA}")


def natural_id_partition(ids: Sequence[Any]) -> Tuple[List[np.ndarray], np.ndarray]:
    """(per client the int64 row indices, the distinct ids in client order) of one client per distinct value of
    ``ids``: clients in sorted id order, each client's rows in ascending order; exactly
    NaturalIdPartitioner's partitions (its ``sorted(dataset.unique(column))`` and its row order), with one stable
    argsort instead of a Python loop over the rows."""
    values = np.asarray(ids)
    if values.dtype == object:  # a column of Python strings: a fixed-width unicode array sorts them the same way
        values = values.astype(str)
    distinct, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    order = np.argsort(inverse.reshape(-1), kind="stable").astype(np.int64)
    return np.split(order, np.cumsum(counts)[:-1]), distinct


def flwr_partition(spec: str, labels: np.ndarray, num_clients: int, seed: int,
                   columns: Optional[dict] = None) -> List[np.ndarray]:
    """Per client the sorted int64 indices into ``labels`` of the Flower Datasets partition ``spec`` over
    ``num_clients`` (``natural_id``: one client per distinct value, which must be ``num_clients``), seeded with
    ``seed``. ``columns``: further columns by name (a hub dataset's), for ``flwr:natural_id:COLUMN``; ``label`` is
    always one."""
    require_hub(f"partition {spec!r}")
    scheme, value = parse_flwr(spec)
    table = dict(columns or {})
    table["label"] = np.asarray(labels)
    if scheme == "natural_id":
        if value not in table:
            raise ConfigError(f"partition is {spec!r} but the dataset has no column {value!r}; expected one of "
                              f"{', '.join(sorted(table))}")
        parts, distinct = natural_id_partition(table[value])
        if len(parts) != num_clients:
            raise ConfigError(f"clients is {num_clients} but partition {spec!r} makes one client per distinct value "
                              f"of {value!r}, which has {len(parts)}; expected --clients {len(parts)}")
        return parts
    return [np.sort(p) for p in _flower_parts(scheme, value, table["label"], num_clients, seed, spec)]


def _flower_parts(scheme: str, value: Any, labels: np.ndarray, num_clients: int, seed: int,
                  spec: str) -> List[np.ndarray]:
    """The partitions flwr-datasets' own partitioner draws, as row indices (a row-number column travels along)."""
    import datasets
    from flwr_datasets import partitioner as flwr

    if len(labels) < num_clients:
        raise ConfigError(f"{len(labels)} samples cannot give each of {num_clients} clients one; pass fewer --clients")
    table = datasets.Dataset.from_dict({"label": np.asarray(labels).tolist(),
                                        "row": np.arange(len(labels), dtype=np.int64).tolist()})
    if scheme == "iid":
        chosen = flwr.IidPartitioner(num_partitions=num_clients)
    elif scheme == "dirichlet":
        chosen = flwr.DirichletPartitioner(num_partitions=num_clients, partition_by="label", alpha=value, seed=seed)
    elif scheme == "pathological":
        chosen = flwr.PathologicalPartitioner(num_partitions=num_clients, partition_by="label",
                                              num_classes_per_partition=value, seed=seed)
    else:
        chosen = flwr.ShardPartitioner(num_partitions=num_clients, partition_by="label",
                                       num_shards_per_partition=value, seed=seed)
    chosen.dataset = table
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # pyarrow's deprecation inside Flower's sort
            return [np.asarray(chosen.load_partition(i)["row"], dtype=np.int64) for i in range(num_clients)]
    except Exception as error:  # noqa: BLE001 (Flower's refusal: a ValueError, or a ZeroDivisionError for shards)
        text = " ".join(str(error).split())[:60].rstrip(".")
        raise ConfigError(f"partition is {spec!r} but Flower Datasets refuses it for {num_clients} clients and "
                          f"{len(labels)} samples ({type(error).__name__}: {text}); expected settings its "
                          "partitioner accepts") from None


def flwr_rule(spec: str) -> str:
    """One phrase for ``data inspect``: which Flower partitioner split the clients."""
    scheme, value = parse_flwr(spec)
    return {"iid": "Flower Datasets' IidPartitioner (contiguous equal shards)",
            "dirichlet": f"Flower Datasets' DirichletPartitioner (alpha {value}, min_partition_size 10, seed = run seed)",
            "pathological": f"Flower Datasets' PathologicalPartitioner ({value} classes a client, random assignment, "
                            "seed = run seed)",
            "shard": f"Flower Datasets' ShardPartitioner ({value} label-sorted shards a client, seed = run seed)",
            "natural_id": f"Flower Datasets' NaturalIdPartitioner on column {value!r} (one client per distinct "
                          "value, sorted)"}[scheme]
