"""The zip archive ``torch.save`` writes, kept honest: every record with its CRC-32 written and checked on reading.

``torch.load`` never checks the CRC-32s: a byte changed inside a stored tensor (on disk, or on the way between
machines) loads as another value, and a run resumed from it silently differs from the one that wrote it."""

from __future__ import annotations

import zipfile
from typing import Any, BinaryIO, Optional

import torch


def save_with_crc(value: Any, handle: BinaryIO) -> None:
    """``torch.save(value, handle)`` with the records' CRC-32s written, even where the process turned them off
    (``torch.serialization.set_crc32_options(False)`` writes zeros, which :func:`damaged_record` would refuse);
    the option is left as it was."""
    serialization = torch.serialization
    if serialization.get_crc32_options():
        torch.save(value, handle)
        return
    serialization.set_crc32_options(True)
    try:
        torch.save(value, handle)
    finally:
        serialization.set_crc32_options(False)


def damaged_record(path: str) -> Optional[str]:
    """The first record of the archive at ``path`` whose bytes fail the CRC-32 written with them, None when every
    record passes. A file that is no zip archive (an old format) is None: its reader says what is wrong with it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except zipfile.BadZipFile:
        return None
