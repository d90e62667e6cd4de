"""CIFAR-10 from its pickled python batches, read with an unpickler that can build numpy arrays and nothing else."""

from __future__ import annotations

import codecs
import io
import logging
import pickle
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from hasfl_ray.data.base import Dataset, FederatedDataset, TensorFederatedDataset
from hasfl_ray.data.download import download_cifar10, resolve_data_dir, short_reason
from hasfl_ray.data.images import check_image_root, partitioned_image_dataset
from hasfl_ray.errors import DataError
from hasfl_ray.files import read_regular
from hasfl_ray.registry import register_dataset

logger = logging.getLogger(__name__)

NUM_CLASSES = 10
BATCH_FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
_PIXELS = 3 * 32 * 32


def _numpy_function(name: str) -> Any:
    # numpy 2 moved numpy.core to numpy._core; batches pickled under either name resolve to the same function.
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    return getattr(multiarray, name)


def _frombuffer() -> Any:
    # protocol 5 pickles an array as numeric._frombuffer(buffer, dtype, shape, order): no code runs but the copy.
    try:
        from numpy._core import numeric
    except ImportError:  # numpy < 2
        from numpy.core import numeric
    return numeric._frombuffer


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()`` as protocol 2 pickles an empty ``bytes`` (an array of zero images): only with no arguments, so
    a pickle cannot make it allocate (``bytes(10**12)``)."""
    if args:
        raise pickle.UnpicklingError(f"bytes called with {len(args)} argument(s); a batch pickles only bytes()")
    return b""


#: The only globals a CIFAR-10 batch references: numpy's array reconstruction (under numpy 1 and 2 module
#: names; ``_frombuffer`` at protocol 5), ``_codecs.encode``, which Python 3 uses to pickle ``bytes`` at protocol 2,
#: and ``bytes()``, which it uses for an empty ``bytes`` (a zero-image array) there.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): lambda: _numpy_function("_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"): lambda: _numpy_function("_reconstruct"),
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("_codecs", "encode"): lambda: codecs.encode,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("__builtin__", "bytes"): lambda: _empty_bytes,
    ("builtins", "bytes"): lambda: _empty_bytes,
}


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle asked for a global outside the allow-list."""

    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.qualified_name = f"{module}.{name}"


class BatchUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings, numbers and numpy arrays; any other global is refused unexecuted."""

    def find_class(self, module: str, name: str) -> Any:
        resolver = _ALLOWED_GLOBALS.get((module, name))
        if resolver is None:
            raise RefusedGlobal(module, name)
        return resolver()


def read_batch(path: Path, labels_key: str = "labels", num_classes: int = NUM_CLASSES,
               what: str = "CIFAR-10 batch") -> Tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64 of one pickled CIFAR-10 batch (or, with ``labels_key``
    ``fine_labels``, 100 classes and ``what`` "CIFAR-100 file", of CIFAR-100's ``train`` or ``test``: the same
    format, :mod:`hasfl_ray.data.cifar100`).

    Accepts the official batches (Python 2 pickles, numpy 1) and re-pickled ones (Python 3, numpy 2),
    with no MD5 check. Raises DataError naming the file when it is corrupt, truncated, not a ``what``,
    or references anything a batch never needs (such a file is not executed), or holds no images.
    """
    hint = "replace it with an intact copy (delete it and pass --download) or pass --data-dir pointing at one"
    payload = read_regular(str(path), what)  # a FIFO or a device: refused, never read
    try:
        batch = BatchUnpickler(io.BytesIO(payload), encoding="latin1").load()
    except RefusedGlobal as error:
        raise DataError(f"{path} was refused unexecuted: it asks to load {error.qualified_name}, which a {what} "
                        f"never needs, so it may be malicious; {hint}") from error
    except Exception as error:  # a damaged pickle can fail in any of a dozen ways; all mean the same thing
        raise DataError(f"{path} is corrupt or truncated ({type(error).__name__}: {short_reason(error)}); {hint}"
                        ) from error
    data, labels = _fields(batch, labels_key)
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == _PIXELS):
        described = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{path} is not a {what}: its data is a {described}, expected uint8 N x {_PIXELS}; "
                        f"{hint}")
    if len(data) == 0:
        raise DataError(f"{path} holds no images (its data is 0 x {_PIXELS}); expected a {what} with at least one "
                        f"image; {hint}")
    if labels is None:  # e.g. a CIFAR-10 batch (labels) where CIFAR-100's file (fine_labels) belongs
        raise DataError(f"{path} is not a {what}: it holds no {labels_key}; {hint}")
    try:
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError) as error:
        raise DataError(f"{path} is not a {what}: its {labels_key} are not integers; {hint}") from error
    if len(labels) != len(data):
        raise DataError(f"{path} is not a {what}: {len(labels)} {labels_key} for {len(data)} images; {hint}")
    outside = labels[(labels < 0) | (labels >= num_classes)]
    if outside.size:
        raise DataError(f"{path} is not a {what}: its {labels_key} include {int(outside[0])}, outside "
                        f"0..{num_classes - 1}; {hint}")
    # Rows are the R, G and B planes of a 32 x 32 image, row-major.
    return data.reshape(-1, 3, 32, 32), labels


def _fields(batch: Any, labels_key: str) -> Tuple[Any, Any]:
    if not isinstance(batch, dict):
        return None, None
    # Official batches have bytes keys decoded as latin1 text; tolerate raw bytes keys too.
    keys: Dict[str, Any] = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in batch.items()}
    return keys.get("data"), keys.get(labels_key)


def _missing(folder: Path) -> List[str]:
    return [name for name in TRAIN_BATCHES + (TEST_BATCH,) if not (folder / name).exists()]  # a FIFO: refused


def load_cifar10(num_clients: int, alpha: float, seed: int, data_dir: str | None = None,
                 download: bool = False, partition: str = "dirichlet",
                 normalization: str = "split") -> TensorFederatedDataset:
    """CIFAR-10 from ``<data_dir>/cifar-10-batches-py`` (a torchvision root), Dirichlet-partitioned.

    Pixels stay uint8 and are standardised per batch with the training split's per-channel mean and
    std. No augmentation (the paper states none).
    """
    root = resolve_data_dir(data_dir)
    folder = root / BATCH_FOLDER
    if _missing(folder) and download:
        download_cifar10(root)
    missing = _missing(folder)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise DataError(f"CIFAR-10 batches not found under {folder} ({missing[0]}{more}); expected --data-dir at a "
                        f"torchvision root holding {BATCH_FOLDER}, or --download")
    train = [read_batch(folder / name) for name in TRAIN_BATCHES]
    test_images, test_labels = read_batch(folder / TEST_BATCH)
    train_images = np.concatenate([images for images, _ in train])
    train_labels = np.concatenate([labels for _, labels in train])
    logger.info("CIFAR-10: %d train, %d test images from %s", len(train_images), len(test_images), folder)
    return partitioned_image_dataset("cifar10", NUM_CLASSES, train_images, train_labels, test_images, test_labels,
                                     num_clients, alpha, seed, partition, normalization)


@register_dataset("cifar10")
class CIFAR10Dataset(Dataset):
    """CIFAR-10 under Dirichlet label skew."""

    model = "cifar10"
    label_partitions = True
    defaults = dict(rounds=200, local_epochs=5, lr=0.01, clip_norm=10.0, batch_size=32)

    def load(self, config) -> FederatedDataset:
        check_image_root("cifar10", config.data_dir)
        return load_cifar10(config.clients, config.alpha, config.seed, config.data_dir, config.download,
                            getattr(config, "partition", "dirichlet"),
                            getattr(config, "input_normalization", "split"))
