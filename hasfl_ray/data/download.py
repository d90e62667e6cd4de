"""Where datasets live and how they are fetched on request; every failed download becomes one sentence."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Callable

from hasfl_ray.errors import DataError

logger = logging.getLogger(__name__)

#: Root used when no ``--data-dir`` is given (relative to the working directory).
DEFAULT_DATA_DIR = "data"

#: Where Shakespeare as LEAF builds it comes from (``--download`` names it instead of fetching anything).
LEAF_SHAKESPEARE = "LEAF (github.com/TalwalkarLab/leaf)"
#: A raw text of plays without play boundaries that ``--data-dir`` also reads (users are roles, merged across plays).
SHAKESPEARE_FILENAME = "tinyshakespeare.txt"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """``data_dir`` as a path, or :data:`DEFAULT_DATA_DIR` when none is given."""
    return Path(data_dir if data_dir else DEFAULT_DATA_DIR).expanduser()


def short_reason(error: BaseException) -> str:
    """The first line of an exception's message (or its type), fit to sit inside a sentence."""
    text = str(error).strip().splitlines()[0].strip() if str(error).strip() else type(error).__name__
    return text.rstrip(".")


def fetch(what: str, url: str, destination: Path, action: Callable[[], None]) -> None:
    """Run the download ``action``; any failure (offline, HTTP error, bad checksum) raises one-sentence DataError."""
    logger.info("downloading %s from %s into %s", what, url, destination)
    try:
        action()
    except DataError:
        raise
    except Exception as error:  # every way a download can fail ends in the same sentence
        raise DataError(f"downloading {what} from {url} into {destination} failed ({short_reason(error)}); "
                        "check the network, or fetch the files elsewhere and pass --data-dir pointing at them"
                        ) from error


def download_emnist(root: Path) -> None:
    """Fetch EMNIST with torchvision's own downloader and unpack the byclass idx files into root/EMNIST/raw.

    Mirrors ``torchvision.datasets.EMNIST.download`` but unpacks only the byclass split, and writes
    nothing else (in particular no ``EMNIST/processed``).
    """
    from torchvision.datasets import EMNIST
    from torchvision.datasets.utils import download_and_extract_archive, extract_archive

    raw = root / "EMNIST" / "raw"

    def action() -> None:
        raw.mkdir(parents=True, exist_ok=True)
        download_and_extract_archive(EMNIST.url, download_root=str(raw), md5=EMNIST.md5)
        gzip_folder = raw / "gzip"
        for archive in sorted(gzip_folder.glob("emnist-byclass-*.gz")):
            extract_archive(str(archive), str(raw))
        shutil.rmtree(gzip_folder, ignore_errors=True)

    fetch("EMNIST", EMNIST.url, raw, action)


def download_cifar10(root: Path) -> None:
    """Fetch CIFAR-10 (python batches) with torchvision's own downloader into root/cifar-10-batches-py."""
    from torchvision.datasets import CIFAR10

    _download_cifar(root, CIFAR10, "CIFAR-10")


def download_cifar100(root: Path) -> None:
    """Fetch CIFAR-100 (python version: ``train``, ``test``, ``meta``) with torchvision's own downloader into
    root/cifar-100-python."""
    from torchvision.datasets import CIFAR100

    _download_cifar(root, CIFAR100, "CIFAR-100")


def _download_cifar(root: Path, dataset: type, what: str) -> None:
    """Download and unpack torchvision's archive of ``dataset`` (CIFAR10 or CIFAR100: its url, filename and tgz_md5)
    into ``root``. Calls torchvision's download-and-extract directly rather than constructing the dataset, whose
    constructor would unpickle the files without restriction."""
    from torchvision.datasets.utils import download_and_extract_archive

    def action() -> None:
        root.mkdir(parents=True, exist_ok=True)
        download_and_extract_archive(dataset.url, download_root=str(root), filename=dataset.filename,
                                     md5=dataset.tgz_md5)

    fetch(what, dataset.url, root, action)


def download_shakespeare(root: Path) -> Path:
    """Refuse (one sentence) to download Shakespeare: the only public single-file sources either mark no plays
    (char-rnn's tinyshakespeare: roles of one name merge across plays, GLOUCESTER 30,026 windows from several) or
    need LEAF's own preprocessing of Gutenberg's complete works to split them by (play, role), which this package
    does not reproduce. The sentence names where to get the data as LEAF builds it."""
    raise DataError(f"Shakespeare is not downloaded: LEAF builds its (play, role) users from Gutenberg's complete "
                    f"works with its own script, so get {LEAF_SHAKESPEARE} (data/shakespeare/preprocess.sh writes "
                    f"all_data.json) or per-play Gutenberg texts (*_gut.txt), and pass --data-dir at them (nothing "
                    f"was written to {root})")
