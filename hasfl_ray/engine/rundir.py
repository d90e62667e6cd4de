"""The run directory contract: config.yaml, metrics.jsonl, clients.csv, summary.json (and checkpoints/)."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from typing import Any, Dict, Iterable, List, Mapping

import yaml

CLIENT_COLUMNS = ("client", "num_samples", "p_max", "tv_distance", "h_tilde", "p_final", "name")
METRIC_KEYS = ("round", "test_accuracy", "test_loss", "avg_p", "coverage", "frozen_fraction", "mean_h", "wall_s")


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: readers see old or new, never half."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class RunDirectory:
    """Writes one run's outputs under ``path``."""

    def __init__(self, path: str):
        self.path = path

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def create(self, config: Mapping[str, Any], execution: Mapping[str, Any]) -> None:
        os.makedirs(self.path, exist_ok=True)
        text = yaml.safe_dump(dict(config), sort_keys=False) + "# execution (does not change results)\n" + \
            "".join(f"# {k}: {v}\n" for k, v in execution.items())
        atomic_write(self.file("config.yaml"), text.encode())

    def reset_metrics(self, lines: Iterable[Dict[str, Any]] = ()) -> None:
        atomic_write(self.file("metrics.jsonl"), "".join(json.dumps(line) + "\n" for line in lines).encode())

    def append_metrics(self, line: Dict[str, Any]) -> None:
        with open(self.file("metrics.jsonl"), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()

    def read_metrics(self) -> List[Dict[str, Any]]:
        if not os.path.exists(self.file("metrics.jsonl")):
            return []
        with open(self.file("metrics.jsonl"), encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def write_clients(self, rows: List[Dict[str, Any]]) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=CLIENT_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(self.file("clients.csv"), buffer.getvalue().encode())

    def write_summary(self, summary: Dict[str, Any]) -> None:
        atomic_write(self.file("summary.json"), (json.dumps(summary, indent=2) + "\n").encode())
