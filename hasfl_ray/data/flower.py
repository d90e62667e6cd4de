"""Flower Datasets' partitioners as ``--partition flwr:...`` choices, and a fast natural-id grouping.

A ``flwr:`` partition is computed by flwr-datasets' own partitioner classes (``flwr_datasets.partitioner``) on a
``datasets.Dataset`` of the labels (and the natural-id column), seeded with the run's seed, so a Flower user's split
is exactly Flower's. ``flwr:natural_id:COLUMN`` is grouped here with one numpy sort (:func:`natural_id_partition`),
which gives exactly :class:`~flwr_datasets.partitioner.NaturalIdPartitioner`'s partitions (same client order: the
sorted distinct ids; same indices: ascending row order) in a fraction of its time (benchmarks/bench_natural_id.py).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import FLWR_EXPECTED, FLWR_SCHEMES, is_flwr, normalise_flwr, parse_flwr  # noqa: F401

logger = logging.getLogger(__name__)

#: The sentence for a run asking for what the ``hub`` extra brings.
HUB_EXTRA = 'pip install ".[hub]"'


def require_hub(what: str) -> None:
    """Refuse, in one sentence naming the extra, ``what`` where ``datasets`` or ``flwr-datasets`` is not installed."""
    import importlib.util

    for module in ("datasets", "flwr_datasets"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"{what} needs the {module.replace('_', '-')} package, which is not installed; "
                              f"expected the hub extra: {HUB_EXTRA}")


def column_array(table, name: str):
    """Column ``name`` of the ``datasets.Dataset`` ``table`` as one array (numpy for numbers, Arrow for the rest),
    read from its Arrow table at once: ``np.asarray(table[name])`` formats it row by row (8 s for 100,000 strings)."""
    if getattr(table, "_indices", None) is not None:  # a selected or shuffled view: its rows in their order
        table = table.flatten_indices()
    column = table.data.column(name)
    if column.type in ("string", "large_string") or str(column.type).startswith(("string", "large_string")):
        return column
    return column.to_numpy()


def natural_id_partition(ids: Any) -> Tuple[List[np.ndarray], np.ndarray]:
    """(per client the int64 row indices, the distinct ids in client order) of one client per distinct value of
    ``ids`` (a sequence, a numpy array or an Arrow array of strings): clients in sorted id order, each client's rows in
    ascending order; exactly NaturalIdPartitioner's partitions (its ``sorted(dataset.unique(column))`` and its row
    order), with one stable argsort of integer codes instead of a Python loop over the rows. Strings are first
    dictionary-encoded by Arrow (each distinct string sorted once, not every row)."""
    values = ids
    if not hasattr(values, "dtype") or getattr(values, "dtype", None) == object or \
            np.asarray(values[:1]).dtype.kind in "US":
        import pyarrow as pa
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(values if isinstance(values, (pa.Array, pa.ChunkedArray)) else
                                       pa.array(np.asarray(values, dtype=object).tolist()))
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        words = np.asarray(encoded.dictionary.to_pylist())
        rank = np.empty(len(words), dtype=np.int64)
        rank[np.argsort(words, kind="stable")] = np.arange(len(words))
        codes = rank[encoded.indices.to_numpy(zero_copy_only=False)]
        distinct = np.sort(words)
    else:
        distinct, codes = np.unique(np.asarray(values), return_inverse=True)
        codes = codes.reshape(-1)
    counts = np.bincount(codes, minlength=len(distinct))
    order = np.argsort(codes, kind="stable").astype(np.int64)
    return np.split(order, np.cumsum(counts)[:-1]), distinct


def flwr_partition(spec: str, labels: np.ndarray, num_clients: int, seed: int,
                   columns: Optional[dict] = None) -> List[np.ndarray]:
    """:func:`flwr_clients`' partition alone."""
    return flwr_clients(spec, labels, num_clients, seed, columns)[0]


def flwr_clients(spec: str, labels: np.ndarray, num_clients: int, seed: int,
                 columns: Optional[dict] = None) -> Tuple[List[np.ndarray], Optional[List[str]]]:
    """Per client the sorted int64 indices into ``labels`` of the Flower Datasets partition ``spec`` over
    ``num_clients`` (``natural_id``: one client per distinct value, which must be ``num_clients``), seeded with
    ``seed``. ``columns``: further columns by name (a hub dataset's), for ``flwr:natural_id:COLUMN``; ``label`` is
    always one. Also returns the clients' names: their ids for ``natural_id``, else None."""
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
        return parts, [str(name) for name in distinct]
    return [np.sort(p) for p in _flower_parts(scheme, value, table["label"], num_clients, seed, spec)], None


def _flower_parts(scheme: str, value: Any, labels: np.ndarray, num_clients: int, seed: int,
                  spec: str) -> List[np.ndarray]:
    """The partitions flwr-datasets' own partitioner draws, as row indices (a row-number column travels along)."""
    import datasets
    from flwr_datasets import partitioner as flwr

    if len(labels) < num_clients:
        raise ConfigError(f"{len(labels)} samples cannot give each of {num_clients} clients one; pass fewer --clients")
    if scheme == "pathological":
        check_pathological(spec, value, np.unique(labels), num_clients)
    if scheme == "shard" and value * num_clients > len(labels):  # Flower divides by a zero shard size
        raise ConfigError(f"partition {spec!r}: {num_clients} clients x {value} shards = {value * num_clients} "
                          f"shards of {len(labels)} training samples; expected S x clients <= {len(labels)}")
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
            warnings.simplefilter("ignore", UserWarning)  # Flower's list of unused classes: the note below instead
            parts = [np.asarray(chosen.load_partition(i)["row"], dtype=np.int64) for i in range(num_clients)]
    except Exception as error:  # noqa: BLE001 (Flower's refusal: a ValueError, or a ZeroDivisionError for shards)
        text = " ".join(str(error).split())
        text = text if len(text) <= 70 else text[:70].rsplit(" ", 1)[0] + " ..."
        instead = {"dirichlet": "a larger ALPHA or fewer --clients",
                   "pathological": "fewer --clients or a smaller K"}.get(scheme, "settings its partitioner accepts")
        raise ConfigError(f"partition {spec!r} is refused by Flower Datasets for {num_clients} clients and "
                          f"{len(labels)} samples ({type(error).__name__}: {text}); expected {instead}") from None
    if scheme == "pathological":
        note_unheld_classes(spec, labels, parts, seed)
    return parts


def check_pathological(spec: str, per_client: int, classes: np.ndarray, num_clients: int) -> None:
    """Refuse, in one sentence, a ``flwr:pathological:K`` whose K classes a client over ``num_clients`` clients
    cannot cover the classes: PathologicalPartitioner deals each client K classes and drops every sample of a class
    no client was dealt, which K x clients < classes makes certain for every seed (CIFAR-100, 10 clients, K = 2:
    80 or more of the 100 classes, at least 80% of the samples)."""
    slots = per_client * num_clients
    if slots >= len(classes):
        return
    raise ConfigError(f"partition {spec!r}: {num_clients} clients x {per_client} classes = {slots} slots for "
                      f"{len(classes)} classes, so {len(classes) - slots}+ classes have no holder; expected K x "
                      f"clients >= {len(classes)}, or classes-even:K or shards:S")


def note_unheld_classes(spec: str, labels: np.ndarray, parts: Sequence[np.ndarray], seed: int) -> None:
    """One warning line where Flower's random class assignment (its rule, kept) dealt some class to no client."""
    held = np.unique(labels[np.concatenate(parts)]) if parts else np.array([], dtype=labels.dtype)
    unheld = np.setdiff1d(np.unique(labels), held)
    if len(unheld):
        shown = ", ".join(str(c) for c in unheld[:10]) + (", ..." if len(unheld) > 10 else "")
        logger.warning("partition %r (Flower's random class assignment, seed %d) dealt %d of the %d classes (%s) to "
                       "no client: their %d training samples are unused (classes-even:K or shards:S give every class "
                       "a holder)", spec, seed, len(unheld), len(np.unique(labels)), shown,
                       int(np.isin(labels, unheld).sum()))


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
