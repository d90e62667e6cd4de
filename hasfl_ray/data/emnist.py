"""EMNIST byclass (62 classes) from torchvision's raw idx files, read directly and never rewritten."""

from __future__ import annotations

import gzip
import logging
import zlib
from pathlib import Path
from typing import Dict, List

import numpy as np

from hasfl_ray.data.base import Dataset, FederatedDataset, TensorFederatedDataset
from hasfl_ray.data.download import download_emnist, resolve_data_dir, short_reason
from hasfl_ray.data.images import check_image_root, partitioned_image_dataset
from hasfl_ray.errors import DataError
from hasfl_ray.files import open_regular
from hasfl_ray.registry import register_dataset

logger = logging.getLogger(__name__)

NUM_CLASSES = 62

#: The four byclass files under <root>/EMNIST/raw (each may also be present gzip-compressed, with ``.gz``).
EMNIST_FILES: Dict[str, str] = {
    "train_images": "emnist-byclass-train-images-idx3-ubyte",
    "train_labels": "emnist-byclass-train-labels-idx1-ubyte",
    "test_images": "emnist-byclass-test-images-idx3-ubyte",
    "test_labels": "emnist-byclass-test-labels-idx1-ubyte",
}

_UBYTE = 0x08


def read_idx(path: Path) -> np.ndarray:
    """An idx file of unsigned bytes (MNIST's format) as a uint8 array of the shape its header announces.

    Reads ``path`` or, when only that exists, ``path.gz``. Raises DataError naming the file when the
    magic number is wrong or the payload is shorter or longer than the header says.
    """
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    hint = "replace it with the official file (delete it and pass --download) or pass --data-dir pointing at an " \
           "intact copy"
    try:
        with open_regular(str(path), "EMNIST file") as handle:  # a FIFO or a device: refused, never read
            if path.suffix == ".gz":
                with gzip.GzipFile(fileobj=handle, mode="rb") as unzipped:
                    blob = np.frombuffer(unzipped.read(), dtype=np.uint8)
            else:
                blob = np.fromfile(handle, dtype=np.uint8)
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{path} could not be read ({short_reason(error)}); {hint}") from error
    if blob.size < 4 or blob[0] != 0 or blob[1] != 0 or blob[2] != _UBYTE or not 1 <= blob[3] <= 4:
        raise DataError(f"{path} is not an idx file of unsigned bytes (bad magic number "
                        f"{bytes(blob[:4]).hex() or 'missing'}); {hint}")
    ndim = int(blob[3])
    header = 4 + 4 * ndim
    if blob.size < header:
        raise DataError(f"{path} is truncated: it ends inside its {header}-byte header; {hint}")
    shape = tuple(int(d) for d in blob[4:header].view(">u4"))
    expected = int(np.prod(shape, dtype=np.int64))
    if blob.size - header != expected:
        state = "truncated" if blob.size - header < expected else "corrupt"
        raise DataError(f"{path} is {state}: its header announces {expected:,} bytes of shape {shape} but it holds "
                        f"{blob.size - header:,}; {hint}")
    return blob[header:].reshape(shape)


def _missing(raw: Path) -> List[str]:
    return [name for name in EMNIST_FILES.values()
            if not (raw / name).exists() and not (raw / (name + ".gz")).exists()]


def load_emnist(num_clients: int, alpha: float, seed: int, data_dir: str | None = None,
                download: bool = False, partition: str = "dirichlet") -> TensorFederatedDataset:
    """EMNIST byclass from ``<data_dir>/EMNIST/raw`` (a torchvision root), Dirichlet-partitioned.

    Images are transposed back to upright (the idx files store them column-major, as torchvision
    does not undo), kept as uint8 and standardised per batch with the training split's mean and std.
    Nothing is written under ``data_dir`` unless ``download`` is set and files are missing.
    """
    root = resolve_data_dir(data_dir)
    raw = root / "EMNIST" / "raw"
    if _missing(raw) and download:
        download_emnist(root)
    missing = _missing(raw)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise DataError(f"EMNIST files not found under {raw} ({missing[0]}{more}); expected --data-dir at a "
                        "torchvision root holding EMNIST/raw, or --download")
    arrays = {key: read_idx(raw / name) for key, name in EMNIST_FILES.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(f"EMNIST {split} files under {raw} do not match: images of shape {images.shape} and "
                            f"labels of shape {labels.shape}; expected N x 28 x 28 images and N labels")
        if not len(images):  # every round would evaluate on nothing and report 0.0
            raise DataError(f"EMNIST {split} files under {raw} hold 0 images; expected N x 28 x 28 images with N > 0 "
                            "(replace them with the official files, or pass --download into an empty --data-dir)")
        if labels.size and int(labels.max()) >= NUM_CLASSES:
            raise DataError(f"{raw / EMNIST_FILES[f'{split}_labels']} holds label {int(labels.max())}, outside "
                            f"byclass's 0..{NUM_CLASSES - 1}; pass --data-dir pointing at the byclass split's files")
    # idx stores each image transposed: swap H and W to get upright characters.
    train_images = arrays["train_images"].transpose(0, 2, 1)[:, None]
    test_images = arrays["test_images"].transpose(0, 2, 1)[:, None]
    logger.info("EMNIST byclass: %d train, %d test images from %s", len(train_images), len(test_images), raw)
    dataset = partitioned_image_dataset("emnist", NUM_CLASSES, np.ascontiguousarray(train_images),
                                        arrays["train_labels"], np.ascontiguousarray(test_images),
                                        arrays["test_labels"], num_clients, alpha, seed, partition)
    return dataset


@register_dataset("emnist")
class EMNISTDataset(Dataset):
    """EMNIST byclass under Dirichlet label skew."""

    model = "emnist"
    label_partitions = True
    defaults = dict(rounds=200, local_epochs=1, lr=0.01, clip_norm=10.0, batch_size=32)

    def load(self, config) -> FederatedDataset:
        check_image_root("emnist", config.data_dir)
        return load_emnist(config.clients, config.alpha, config.seed, config.data_dir, config.download,
                           getattr(config, "partition", "dirichlet"))
