"""CIFAR-100 from torchvision's ``cifar-100-python`` files (``train``, ``test``), fine labels, read with CIFAR-10's
restricted unpickler (:func:`hasfl_ray.data.cifar10.read_batch`): the two files are pickled exactly as CIFAR-10's
batches are, with ``fine_labels`` (100 classes) and ``coarse_labels`` (20 superclasses) in place of ``labels``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List

from hasfl_ray.data.base import Dataset, FederatedDataset, TensorFederatedDataset
from hasfl_ray.data.cifar10 import read_batch
from hasfl_ray.data.download import download_cifar100, resolve_data_dir
from hasfl_ray.data.images import check_image_root, partitioned_image_dataset
from hasfl_ray.errors import DataError
from hasfl_ray.registry import register_dataset

logger = logging.getLogger(__name__)

NUM_CLASSES = 100
FOLDER = "cifar-100-python"
TRAIN_FILE = "train"
TEST_FILE = "test"
#: The label each sample is trained on: the 100 fine classes (``coarse_labels``, the 20 superclasses, are unused).
LABELS_KEY = "fine_labels"
WHAT = "CIFAR-100 file"

#: The full official training split's per-channel mean and std of ``pixels / 255`` (R, G, B; std over all pixels,
#: ddof 0), as weiaicunzai/pytorch-cifar100 ``conf/global_settings.py`` (CIFAR100_TRAIN_MEAN / _STD) records them.
#: Not used to normalise: like CIFAR-10, the loader standardises with the exact statistics of the training split it
#: loaded (:func:`hasfl_ray.data.images.channel_statistics`), which on the full split are these numbers; a subset
#: (the 1,000-image sample) gets its own. The federated sources do not give CIFAR-100 its own constants: FedRolex
#: (``data.py`` at 3f1485e) and FIARSE (``data/cifar100/data.py`` at 7b49718) normalise CIFAR-100 with CIFAR-10's
#: ``Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))``, and HeteroFL has no CIFAR-100.
REFERENCE_MEAN = (0.5070751592371323, 0.48654887331495095, 0.4409178433670343)
REFERENCE_STD = (0.2673342858792401, 0.2564384629170883, 0.27615047132568404)


def _missing(folder: Path) -> List[str]:
    return [name for name in (TRAIN_FILE, TEST_FILE) if not (folder / name).exists()]


def load_cifar100(num_clients: int, alpha: float, seed: int, data_dir: str | None = None,
                  download: bool = False, partition: str = "dirichlet",
                  normalization: str = "split") -> TensorFederatedDataset:
    """CIFAR-100 from ``<data_dir>/cifar-100-python`` (a torchvision root), fine labels, Dirichlet-partitioned
    (or by ``partition``). ``meta`` (the class names) is not read. No MD5 is checked, so re-packed files load.

    Pixels stay uint8 and are standardised per batch with the training split's per-channel mean and std, as
    CIFAR-10's are. No augmentation unless the run asks for one (``augmentation``).
    """
    root = resolve_data_dir(data_dir)
    folder = root / FOLDER
    if _missing(folder) and download:
        download_cifar100(root)
    missing = _missing(folder)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise DataError(f"CIFAR-100 files not found under {folder} ({missing[0]}{more}); expected --data-dir at a "
                        f"torchvision root holding {FOLDER}, or --download")
    train_images, train_labels = read_batch(folder / TRAIN_FILE, LABELS_KEY, NUM_CLASSES, WHAT)
    test_images, test_labels = read_batch(folder / TEST_FILE, LABELS_KEY, NUM_CLASSES, WHAT)
    logger.info("CIFAR-100: %d train, %d test images from %s", len(train_images), len(test_images), folder)
    return partitioned_image_dataset("cifar100", NUM_CLASSES, train_images, train_labels, test_images, test_labels,
                                     num_clients, alpha, seed, partition, normalization)


@register_dataset("cifar100")
class CIFAR100Dataset(Dataset):
    """CIFAR-100 (fine labels) under Dirichlet label skew."""

    model = "cifar100"
    label_partitions = True
    # The paper has no CIFAR-100 protocol: CIFAR-10's defaults.
    defaults = dict(rounds=200, local_epochs=5, lr=0.01, clip_norm=10.0, batch_size=32)

    def load(self, config) -> FederatedDataset:
        check_image_root("cifar100", config.data_dir)
        return load_cifar100(config.clients, config.alpha, config.seed, config.data_dir, config.download,
                             getattr(config, "partition", "dirichlet"),
                             getattr(config, "input_normalization", "split"))
