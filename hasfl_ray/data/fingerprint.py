"""A dataset known by its content: the fingerprint of a loaded federated dataset (its train and test sizes, a sha256 of
its labels and one of its partition: each client's sample indices), recorded in config.yaml (``data_fingerprint``)
and summary.json, so that --resume, a sweep's reuse and a report's rows notice other data behind the same dataset
name (another ``--data-dir``, files replaced) as ``input_sha256`` notices a changed file. The data's path itself
is not part of a run's result: two copies of the same files give the same fingerprint."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Dict, Iterable, List, Mapping, Optional

import numpy as np

#: The fingerprint's keys, in the order a sentence names them.
KEYS = ("train_size", "test_size", "labels_sha256", "partition_sha256")


def data_view(config: Any) -> Any:
    """``config`` as a dataset's ``load`` sees it: ``seed`` is the data seed (``--data-seed``, else the seed), so a
    loader's partition (a plug-in's too) follows --data-seed and never the initialisation's seed."""
    seed = getattr(config, "effective_data_seed", config.seed)
    return config if seed == config.seed else dataclasses.replace(config, seed=seed)


def _digest(arrays: Iterable[Any]) -> str:
    """One sha256 over ``arrays`` (tensors or arrays, each as little-endian int64 after its length), so the same
    values give the same digest whatever dtype or device held them."""
    digest = hashlib.sha256()
    for array in arrays:
        if hasattr(array, "detach"):
            array = array.detach().cpu().numpy()
        values = np.ascontiguousarray(np.asarray(array).astype("<i8", copy=False).ravel())
        digest.update(len(values).to_bytes(8, "little"))
        digest.update(memoryview(values).cast("B"))  # no copy: a million clients hash in place
    return digest.hexdigest()


def dataset_fingerprint(dataset: Any) -> Dict[str, Any]:
    """``{train_size, test_size, labels_sha256, partition_sha256}`` of a loaded federated dataset.

    ``labels_sha256`` is the data's own, whatever the partition: a dataset held as tensors (the image sets, digits)
    hashes its training and test labels, a text dataset (Shakespeare) its character stream; ``partition_sha256`` the
    split: each client's index list (with ``classes:K`` also its own test shard and label split) or window starts.
    Any other dataset (the synthetic data, generated per client from the config; a plug-in's own class) holds no
    labels to hash without generating every client's (11 s for 10,000 synthetic clients): its labels hash is None and
    its partition hash covers its clients' sizes; or it gives a ``fingerprint()`` of its own."""
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        found = dict(own())
    elif hasattr(dataset, "train_y") and hasattr(dataset, "client_indices"):
        extra: List[Any] = []
        for name in ("client_test_indices", "label_split"):
            lists = getattr(dataset, name, None)
            extra += [] if lists is None else [np.asarray(list(item), dtype=np.int64) for item in lists]
        found = {"labels_sha256": _digest([dataset.train_y, dataset.test_y]),
                 "partition_sha256": _digest(list(dataset.client_indices) + extra)}
    elif hasattr(dataset, "stream") and hasattr(dataset, "client_starts"):
        found = {"labels_sha256": _digest([dataset.stream]),
                 "partition_sha256": _digest(list(dataset.client_starts) + [dataset.test_starts])}
    else:  # no labels held apart from the clients' (generated per client): their sizes (labels_sha256 None)
        found = {"labels_sha256": None, "partition_sha256": _digest([dataset.client_sizes()])}
    found.setdefault("train_size", dataset.train_size)
    found.setdefault("test_size", dataset.test_size)
    return {key: None if found.get(key) is None else int(found[key]) if key.endswith("_size") else str(found[key])
            for key in KEYS}


def config_fingerprint(config: Any) -> Dict[str, Any]:
    """The fingerprint of the data a resolved run config trains on: its dataset loaded as a run loads it."""
    from hasfl_ray.data import load_plugin_dataset
    from hasfl_ray.registry import lookup

    return dataset_fingerprint(load_plugin_dataset(lookup("dataset", config.dataset), data_view(config)))


def _shown(value: Any) -> str:
    return str(value)[:12] if isinstance(value, str) else repr(value)


def fingerprint_change(old: Optional[Mapping[str, Any]], new: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The part of two fingerprints that differs (``labels_sha256 1a2b3c4d5e6f -> 9f8e7d6c5b4a``), None where they
    agree or either is missing (a run of before the fingerprint is not checked on it, as ``input_sha256``)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return None
    parts = [f"{key} {_shown(old.get(key))} -> {_shown(new.get(key))}" for key in KEYS
             if old.get(key) != new.get(key) and old.get(key) is not None and new.get(key) is not None]
    return ", ".join(parts) or None


def data_change(stored: Mapping[str, Any], config: Any) -> Optional[str]:
    """One phrase naming what differs between a stored run's data and ``config``'s (both fingerprinted), with the
    data directories where they differ, for :func:`~hasfl_ray.engine.checkpoint.config_differences`."""
    change = fingerprint_change(stored.get("data_fingerprint"), getattr(config, "data_fingerprint", None))
    if change is None:
        return None
    old, new = stored.get("data_dir"), getattr(config, "data_dir", None)
    where = f" (data_dir {old!r} -> {new!r})" if old != new else f" (data_dir {new!r})"
    return f"the data of dataset {stored.get('dataset', getattr(config, 'dataset', ''))!r}{where} differ: {change}"


def pooling_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> Optional[str]:
    """What differs between the data of two stored run configs that a report would pool as seeds of one row: every
    part where they drew their data from one data seed, else the labels alone (each seed partitions the same data its
    own way; the labels of a dataset with none apart from its clients' are not compared)."""
    def seed(config: Mapping[str, Any]) -> Any:
        return config.get("seed") if config.get("data_seed") is None else config.get("data_seed")

    first, second = old.get("data_fingerprint"), new.get("data_fingerprint")
    if seed(old) != seed(new) and isinstance(first, Mapping) and isinstance(second, Mapping):
        first, second = {"labels_sha256": first.get("labels_sha256")}, {"labels_sha256": second.get("labels_sha256")}
    return fingerprint_change(first, second)
