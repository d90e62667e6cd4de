"""``--dataset hf:PATH_OR_NAME``: any Hugging Face ``datasets`` image dataset, read from disk (``save_to_disk``'s
folder, by ``datasets.load_from_disk``) or from the hub cache offline (``datasets.load_dataset`` with
``HF_DATASETS_OFFLINE=1``: nothing is downloaded), trained by an image CNN sized to its images.

Columns are named in the spec: ``hf:PATH?image=img&label=label`` (default: the column of ``Image`` feature, else the
one called ``image`` or ``img``; the ``ClassLabel`` column, else ``label`` or ``labels``). Images become uint8
N x C x H x W tensors standardised per channel with the training split's statistics, as the other image sets; the
training split is partitioned by ``--partition`` (``flwr:natural_id:COLUMN`` reads any column). ``?text=COLUMN`` reads
a text column character by character instead (:mod:`hasfl_ray.data.hub_text`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterator, Optional, Tuple
from urllib.parse import parse_qsl

import numpy as np
import torch

from hasfl_ray.data.base import Dataset, FederatedDataset, TensorFederatedDataset
from hasfl_ray.data.flower import column_array, flwr_clients, is_flwr, parse_flwr, require_hub
from hasfl_ray.data.images import MIN_CLIENT_SIZE, channel_statistics
from hasfl_ray.data.partition import partition_splits
from hasfl_ray.errors import ConfigError, DataError

PREFIX = "hf:"
TEST_FRACTION = 0.2
_KEYS = ("image", "label", "text")


def is_hub(name: Any) -> bool:
    """Whether ``name`` is a ``hf:`` dataset spec."""
    return isinstance(name, str) and name.startswith(PREFIX)


def parse_hub(spec: str) -> Tuple[str, Dict[str, str]]:
    """(location, {image, label: column}) of ``hf:LOCATION[?image=COL&label=COL]``; one sentence otherwise."""
    location, _, query = spec[len(PREFIX):].partition("?")
    if not location:
        raise ConfigError(f"dataset is {spec!r}; expected hf:PATH (a save_to_disk folder) or hf:NAME (a dataset in "
                          "the hub cache), optionally ?image=COLUMN&label=COLUMN")
    columns = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    for key, value in columns.items():
        if key not in _KEYS or not value:
            raise ConfigError(f"dataset is {spec!r} but {key}={value!r} is not a column choice; expected "
                              "image=COLUMN and label=COLUMN, or text=COLUMN")
    return location, columns


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """``datasets`` and ``huggingface_hub`` offline for the block: both read HF_DATASETS_OFFLINE / HF_HUB_OFFLINE
    once, as they are imported, so the environment variables alone (set after ``import datasets``) let
    ``load_dataset`` of a name not in the cache try the network, 5 retries and about 30 s before it failed. The
    modules' flags and the variables are set, and put back after."""
    import datasets
    import huggingface_hub.constants as hub_constants

    flags = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
             (hub_constants, "HF_HUB_OFFLINE")]
    saved_flags = [getattr(owner, name, None) for owner, name in flags]
    saved_env = {name: os.environ.get(name) for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    for owner, name in flags:
        setattr(owner, name, True)
    os.environ.update({name: "1" for name in saved_env})
    try:
        yield
    finally:
        for (owner, name), value in zip(flags, saved_flags):
            setattr(owner, name, value)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def read_hub(spec: str):
    """(train, test or None) ``datasets.Dataset`` of ``spec``: a folder by ``load_from_disk``, else the hub cache
    offline; one sentence (DataError) where neither holds it."""
    require_hub(f"dataset {spec!r}")
    import datasets

    location, _ = parse_hub(spec)
    datasets.disable_progress_bars()
    if os.path.isdir(location):
        try:
            loaded = datasets.load_from_disk(location)
        except Exception as error:  # noqa: BLE001 (datasets raises FileNotFoundError, ValueError, ArrowInvalid...)
            raise DataError(f"dataset {spec!r} is not a dataset saved by save_to_disk ({type(error).__name__}); "
                            "expected a folder that datasets' save_to_disk wrote") from None
    else:
        try:
            with offline():  # never download: the hub cache only
                loaded = datasets.load_dataset(location)
        except Exception as error:  # noqa: BLE001
            offline_miss = isinstance(error, ConnectionError)  # the offline mode's answer for a name not cached
            why = "" if offline_miss else f" ({type(error).__name__})"
            raise DataError(f"dataset {spec!r} is neither a folder nor a dataset in the hub cache{why}; expected a "
                            "save_to_disk folder or a cached dataset (nothing is downloaded)") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DataError(f"dataset {spec!r} has splits {', '.join(loaded)}; expected a 'train' split")
        test = next((loaded[name] for name in ("test", "validation") if name in loaded), None)
        return loaded["train"], test
    return loaded, None


def _column(spec: str, table, key: str, given: Optional[str]) -> str:
    """The column of ``key`` (image or label): the one named, else the one its feature type or name says."""
    import datasets

    names = list(table.column_names)
    if given is not None:
        if given not in names:
            raise DataError(f"dataset {spec!r} has no column {given!r}; expected one of {', '.join(names)}")
        return given
    kind = datasets.Image if key == "image" else datasets.ClassLabel
    typed = [n for n in names if isinstance(table.features[n], kind)]
    usual = [n for n in names if n in (("image", "img") if key == "image" else ("label", "labels"))]
    if typed or usual:
        return (typed or usual)[0]
    raise DataError(f"dataset {spec!r} has no {key} column among {', '.join(names)}; expected one named in the "
                    f"spec, e.g. {spec.partition('?')[0]}?{key}=COLUMN")


def image_array(spec: str, table, column: str) -> np.ndarray:
    """uint8 N x C x H x W of ``table``'s image column (PIL images, H x W or H x W x C arrays, values 0..255 or
    floats in [0, 1]); one sentence for a text column, ragged or non-square images."""
    feature = table.features[column]
    if getattr(feature, "dtype", None) == "string":
        raise DataError(f"dataset {spec!r}: column {column!r} holds text; expected an image column, or "
                        f"?text={column} for text")
    images = _nested_lists(table, column)
    try:
        if images is None:  # PIL images, arrays: one batch through datasets' numpy formatting
            rows = table.select_columns([column]).with_format("numpy")[:][column]
            images = np.stack([np.asarray(row) for row in rows]) if not isinstance(rows, np.ndarray) or \
                rows.dtype == object else rows
    except ValueError:
        raise DataError(f"dataset {spec!r}: the images of column {column!r} differ in shape; expected images of "
                        "one size") from None
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4:
        images = np.moveaxis(images, 3, 1) if images.shape[3] in (1, 3, 4) and images.shape[1] not in (1, 3) \
            else images
    if images.ndim != 4 or images.shape[2] != images.shape[3] or not np.issubdtype(images.dtype, np.number):
        raise DataError(f"dataset {spec!r}: column {column!r} holds {images.dtype} of shape "
                        f"{tuple(images.shape[1:])}; expected square images (H x W, H x W x C or C x H x W)")
    if not np.issubdtype(images.dtype, np.integer):
        images = np.round(np.clip(images, 0.0, 1.0) * 255.0) if float(np.max(images, initial=0)) <= 1.0 \
            else np.clip(images, 0, 255)
    return np.ascontiguousarray(images.astype(np.uint8))


def _nested_lists(table, column: str) -> Optional[np.ndarray]:
    """A column of equal-shaped nested lists of numbers (``List(List(Value('uint8')))``, what ``from_dict`` makes of
    arrays) as one numpy array straight from its Arrow buffers; None for any other column (or ragged lists)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if getattr(table, "_indices", None) is not None:
        table = table.flatten_indices()
    values = table.data.column(column).combine_chunks()
    shape = [len(values)]
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or \
            pa.types.is_fixed_size_list(values.type):
        lengths = pc.list_value_length(values)
        low, high = pc.min(lengths).as_py(), pc.max(lengths).as_py()
        if low is None or low != high or values.null_count:
            return None
        shape.append(low)
        values = values.flatten()
    if len(shape) < 3 or not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        return None
    return values.to_numpy(zero_copy_only=False).reshape(shape)


def label_array(spec: str, table, column: str) -> np.ndarray:
    """int64 labels of ``table``'s label column (class indices >= 0); one sentence otherwise."""
    labels = np.asarray(table.select_columns([column]).with_format("numpy")[:][column])
    if not np.issubdtype(labels.dtype, np.integer) or (labels.size and labels.min() < 0):
        raise DataError(f"dataset {spec!r}: label column {column!r} holds {labels.dtype} values; expected class "
                        "indices 0, 1, 2, ... (a ClassLabel or integer column)")
    return labels.astype(np.int64)


def hub_model_config(channels: int, size: int, num_classes: int) -> Dict[str, Any]:
    """The image CNN of a hub dataset: the paper's stages (the built-in emnist/cifar CNN) from 16 pixels up, the
    digits' small one below."""
    if size >= 16:
        return dict(kind="cnn", in_channels=channels, num_classes=num_classes, image_size=size,
                    stages=((64, 64), (128, 128), (256, 256)), fc_width=512)
    return dict(kind="cnn", in_channels=channels, num_classes=num_classes, image_size=size,
                stages=((32,), (64,)), fc_width=128)


class HubDataset(Dataset):
    """Base of the classes :func:`hub_dataset_class` makes, one per ``hf:`` spec."""

    spec: str = ""
    model = "hf_image"
    label_partitions = True
    defaults = dict(rounds=50, local_epochs=1, lr=0.01, clip_norm=10.0, batch_size=32)

    def data_files(self, config):
        location, _ = parse_hub(self.spec)
        return [location] if os.path.isdir(location) else None

    def load(self, config) -> FederatedDataset:
        return load_hub(self.spec, config.clients, config.alpha, config.seed, getattr(config, "partition", "dirichlet"))


def load_hub(spec: str, num_clients: int, alpha: float, seed: int, partition: str) -> TensorFederatedDataset:
    """The federated image dataset of ``spec``: its train split partitioned by ``partition`` (Dirichlet(``alpha``),
    the built-in schemes, or a ``flwr:`` partitioner) from ``seed``; its test split, else 20 % of its rows (a fixed
    permutation of seed 0, as digits)."""
    train, test = read_hub(spec)
    _, given = parse_hub(spec)
    if "text" in given:  # character-level text, one client per author (data/hub_text.py)
        from hasfl_ray.data.hub_text import load_hub_text

        return load_hub_text(spec, train, given["text"], num_clients, seed, partition)
    image_col = _column(spec, train, "image", given.get("image"))
    label_col = _column(spec, train, "label", given.get("label"))
    images, labels = image_array(spec, train, image_col), label_array(spec, train, label_col)
    natural = is_flwr(partition) and parse_flwr(partition)[0] == "natural_id"
    ids = None
    if natural:
        column = parse_flwr(partition)[1]
        if column not in train.column_names:
            raise DataError(f"partition is {partition!r} but dataset {spec!r} has no column {column!r}; expected one "
                            f"of {', '.join(train.column_names)}")
        ids = column_array(train, column)
    if test is not None:
        test_images, test_labels = image_array(spec, test, image_col), label_array(spec, test, label_col)
        train_rows = np.arange(len(labels))
    else:
        order = np.random.default_rng(0).permutation(len(labels))
        n_test = max(1, int(round(TEST_FRACTION * len(labels))))
        test_rows, train_rows = order[:n_test], np.sort(order[n_test:])
        test_images, test_labels = images[test_rows], labels[test_rows]
    train_images, train_labels = images[train_rows], labels[train_rows]
    num_classes = int(max(labels.max(initial=0), test_labels.max(initial=0))) + 1
    feature = train.features[label_col]
    num_classes = max(num_classes, int(getattr(feature, "num_classes", 0) or 0))
    mean, std = channel_statistics(train_images)
    names, test_parts, label_split = None, None, None
    if natural:
        ids = ids.take(train_rows) if hasattr(ids, "take") and not isinstance(ids, np.ndarray) else ids[train_rows]
        parts, names = flwr_clients(partition, train_labels, num_clients, seed, {parse_flwr(partition)[1]: ids})
    else:
        parts, test_parts, label_split = partition_splits(train_labels, test_labels, num_clients, partition, alpha,
                                                          np.random.default_rng(seed), min_size=MIN_CLIENT_SIZE,
                                                          seed=seed)
    dataset = TensorFederatedDataset(
        spec, HubDataset.model, num_classes, torch.from_numpy(train_images), torch.from_numpy(train_labels),
        torch.from_numpy(test_images), torch.from_numpy(test_labels), [torch.from_numpy(p) for p in parts],
        client_names=names, mean=mean, std=std, label_split=label_split,
        client_test_indices=None if test_parts is None else [torch.from_numpy(p) for p in test_parts])
    dataset.model_config = hub_model_config(train_images.shape[1], train_images.shape[2], num_classes)
    return dataset


def hub_dataset_class(spec: str) -> type:
    """The dataset plug-in class of the ``hf:`` spec (``lookup("dataset", "hf:...")``); the hub extra is asked for
    in one sentence where it is not installed."""
    _, given = parse_hub(spec)
    require_hub(f"dataset {spec!r}")
    extra = {}
    if "text" in given:  # trained as Shakespeare is: its model and protocol defaults
        extra = dict(model="shakespeare", defaults=dict(rounds=200, local_epochs=1, lr=0.1, clip_norm=5.0,
                                                        batch_size=10))
    return type("HubDataset_" + "".join(c if c.isalnum() else "_" for c in spec)[:60], (HubDataset,),
                {"spec": spec, "__module__": __name__, **extra})
