"""Inputs known by their content: the sha256 of every file a run reads beside its config (a device trace, a plug-in's
FILE.py), recorded in config.yaml as ``input_sha256`` so that --resume and a sweep's reuse notice a changed file."""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Any, Dict, Optional

#: Bytes read at a time while hashing (a trace of millions of devices is never held whole for its hash).
CHUNK = 1 << 20


def file_sha256(path: str) -> Optional[str]:
    """The sha256 of the file at ``path`` (None where there is no regular file to read: the reader says why). A
    config is resolved several times a run (and once a cell by a sweep): the file is read again only when its path,
    size or modification time changed."""
    if not isinstance(path, str) or not os.path.isfile(path):
        return None
    status = os.stat(path)
    return _sha256(os.path.realpath(path), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> Optional[str]:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(CHUNK), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def input_hashes(config: Any) -> Optional[Dict[str, str]]:
    """``{input: sha256}`` of the files ``config`` reads: ``devices`` (its trace), and ``dataset``, ``algorithm`` and
    ``model`` where they name a plug-in ``FILE.py:Class``; None when it reads none."""
    found: Dict[str, str] = {}
    devices = getattr(config, "devices", None)
    trace = devices.get("trace") if isinstance(devices, dict) else devices if isinstance(devices, str) else None
    if isinstance(trace, str) and trace.strip().lower().endswith(".csv"):
        digest = file_sha256(trace.strip())
        if digest:
            found["devices"] = digest
    for key in ("dataset", "algorithm", "model"):
        spec = getattr(config, key, None)
        if isinstance(spec, str) and ":" in spec and spec.rpartition(":")[0].endswith(".py"):
            digest = file_sha256(spec.rpartition(":")[0])
            if digest:
                found[key] = digest
    return found or None
