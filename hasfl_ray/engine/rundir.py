"""The run directory contract: config.yaml, metrics.jsonl, clients.csv, summary.json (and checkpoints/)."""

from __future__ import annotations

import csv
import errno
import fcntl
import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import yaml

from hasfl_ray.errors import ConfigError
from hasfl_ray.files import atomic_text_writer, atomic_write

CLIENT_COLUMNS = ("client", "num_samples", "p_max", "tv_distance", "h_tilde", "p_final", "name")
METRIC_KEYS = ("round", "test_accuracy", "test_loss", "avg_p", "coverage", "frozen_fraction", "mean_h",
               "rejected_updates", "wall_s")


class RunLock:
    """An exclusive lock on a run directory for as long as a run writes it (``flock`` on the directory itself, so
    it is released when the process ends, however it ends). A second run pointed at the same directory is
    refused in one sentence instead of interleaving its outputs."""

    def __init__(self, path: str):
        self.path = path
        self._fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"run directory {self.path!r} is being written by another hasfl-ray run; expected "
                                  "one run per directory at a time (wait for it, or choose another --out)") from None
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class RunDirectory:
    """Writes one run's outputs under ``path``."""

    def __init__(self, path: str):
        self.path = path
        self._metrics_text = ""

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def clear(self) -> None:
        """Remove everything in the directory (``--force``), keeping the directory itself and so its lock."""
        import shutil

        for entry in os.scandir(self.path):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)

    def create(self, config: Mapping[str, Any], execution: Mapping[str, Any]) -> None:
        os.makedirs(self.path, exist_ok=True)
        text = yaml.safe_dump(dict(config), sort_keys=False) + "# execution (does not change results)\n" + \
            "".join(f"# {k}: {v}\n" for k, v in execution.items())
        atomic_write(self.file("config.yaml"), text.encode())

    def reset_metrics(self, lines: Iterable[Dict[str, Any]] = ()) -> None:
        self._metrics_text = "".join(json.dumps(line) + "\n" for line in lines)
        atomic_write(self.file("metrics.jsonl"), self._metrics_text.encode())

    def append_metrics(self, line: Dict[str, Any]) -> None:
        """Add one round's line; the file is rewritten whole through :func:`atomic_write`, so a crash or a full
        disk leaves the previous version (never a half line)."""
        text = self._metrics_text + json.dumps(line) + "\n"
        atomic_write(self.file("metrics.jsonl"), text.encode())
        self._metrics_text = text

    def read_metrics(self) -> List[Dict[str, Any]]:
        if not os.path.exists(self.file("metrics.jsonl")):
            return []
        with open(self.file("metrics.jsonl"), encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def write_clients(self, rows: Iterable[Sequence[Any]]) -> None:
        """clients.csv from rows of :data:`CLIENT_COLUMNS` values (sequences, or mappings by column), streamed to
        the file as they come (a million clients never sit in memory as rows), which replaces the old one only
        once complete."""
        with atomic_text_writer(self.file("clients.csv")) as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(CLIENT_COLUMNS)
            writer.writerows([row[c] for c in CLIENT_COLUMNS] if isinstance(row, Mapping) else row for row in rows)

    def write_summary(self, summary: Dict[str, Any]) -> None:
        atomic_write(self.file("summary.json"), (json.dumps(summary, indent=2) + "\n").encode())
