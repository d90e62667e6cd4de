"""Atomic checkpoints of a run (RUN/checkpoints/latest.pt) and the config check that guards --resume."""

from __future__ import annotations

import glob
import io
import os
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch
import yaml

from hasfl_ray.engine.config import EXECUTION_FIELDS, DuplicateKeyError, RunConfig, strict_yaml_load
from hasfl_ray.errors import ConfigError
from hasfl_ray.files import atomic_write

CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_FILE = "latest.pt"
#: 2: read with ``torch.load(weights_only=True)``; numpy arrays are stored as tagged tensors (format 1 pickled them).
FORMAT_VERSION = 2
#: The key that marks a numpy array stored as a tensor inside a checkpoint.
NDARRAY_TAG = "__ndarray__"


@dataclass
class Checkpoint:
    """Everything a run needs to continue bit-identically after ``round`` completed rounds.

    Attributes:
        round: rounds completed (the next round to run).
        params: the global parameters, name -> float32 CPU tensor.
        algorithm_state: :meth:`Algorithm.state_dict` after round ``round - 1``.
        history: the metrics lines of rounds 0..round-1 (best accuracy and averages derive from them).
        config: :meth:`RunConfig.to_dict` of the run that wrote it.
        elapsed_s: wall seconds spent in the round loop so far, over every resumption.
    """

    round: int
    params: Dict[str, torch.Tensor]
    algorithm_state: Dict[str, Any]
    history: List[Dict[str, Any]]
    config: Dict[str, Any]
    elapsed_s: float
    format_version: int = FORMAT_VERSION


def checkpoint_path(run_dir: str) -> str:
    return os.path.join(run_dir, CHECKPOINT_DIR, CHECKPOINT_FILE)


def save_checkpoint(run_dir: str, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` through a temporary file and a rename: a crash mid-write leaves the previous one whole."""
    directory = os.path.join(run_dir, CHECKPOINT_DIR)
    os.makedirs(directory, exist_ok=True)
    for stale in glob.glob(os.path.join(directory, ".tmp-*")):  # left by a process killed mid-write
        os.unlink(stale)
    buffer = io.BytesIO()
    torch.save(to_plain(asdict(checkpoint)), buffer)
    atomic_write(checkpoint_path(run_dir), buffer.getvalue())


def load_checkpoint(run_dir: str) -> Optional[Checkpoint]:
    """The run directory's checkpoint, None when it has none; one sentence when it is unreadable."""
    path = checkpoint_path(run_dir)
    if not os.path.exists(path):
        return None
    try:
        # Run directories travel between people and machines: the restricted unpickler builds tensors and plain
        # containers only, so a crafted file is refused before any of its code can run.
        values = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(values, dict) or values.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"not a hasfl-ray checkpoint of format {FORMAT_VERSION}")
        return Checkpoint(**{f.name: from_plain(values[f.name]) for f in fields(Checkpoint)})
    except Exception as error:  # any unpickling or shape problem means the file cannot be trusted
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if "weights_only" in str(error) or "Unsupported global" in str(error):
            reason = "it holds objects other than tensors and plain values, which are never unpickled"
        raise ConfigError(f"checkpoint {path!r} cannot be read ({reason[:160]}); expected a checkpoint written by "
                          "hasfl-ray, or --force without --resume to start the run again") from None


def load_checkpoint_round(run_dir: str) -> int:
    """Rounds completed by the run directory's readable checkpoint; 0 when it has none or it cannot be read."""
    try:
        checkpoint = load_checkpoint(run_dir)
    except ConfigError:
        return 0
    return checkpoint.round if checkpoint is not None else 0


def to_plain(value: Any) -> Any:
    """``value`` with numpy arrays as tagged tensors and numpy scalars as Python numbers, so that
    ``torch.load(weights_only=True)`` can read it back (containers: dict, list, tuple)."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError("checkpoint state holds a numpy object array; expected numeric arrays")
        return {NDARRAY_TAG: torch.from_numpy(np.ascontiguousarray(value).copy())}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_plain(item) for item in value)
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    raise TypeError(f"checkpoint state holds a {type(value).__name__}; expected tensors, numpy arrays and plain "
                    "values")


def from_plain(value: Any) -> Any:
    """The inverse of :func:`to_plain` (tagged tensors back to numpy arrays, bit for bit)."""
    if isinstance(value, dict):
        if set(value) == {NDARRAY_TAG} and isinstance(value[NDARRAY_TAG], torch.Tensor):
            return value[NDARRAY_TAG].numpy()
        return {key: from_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(from_plain(item) for item in value)
    return value


def stored_config(run_dir: str, checkpoint: Optional[Checkpoint]) -> Optional[Dict[str, Any]]:
    """The config a run directory was written with: the checkpoint's, else config.yaml's, else None."""
    if checkpoint is not None:
        return dict(checkpoint.config)
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            values = strict_yaml_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        reason = error.strerror if isinstance(error, OSError) else "it is not UTF-8 text" \
            if isinstance(error, UnicodeDecodeError) else f"it gives the key {error.key!r} twice" \
            if isinstance(error, DuplicateKeyError) else "it is not valid YAML"
        raise ConfigError(f"config file {path!r} cannot be read ({reason}); expected the config.yaml of a run") \
            from None
    return values if isinstance(values, dict) else None


#: What a run written before a field existed did, where the field's default (``auto``) would resolve otherwise.
BEFORE_FIELD: Dict[str, Any] = {"cuda_graphs": "off"}  # before --cuda-graphs, every step ran eagerly


def config_differences(stored: Mapping[str, Any], config: RunConfig) -> List[str]:
    """``name: stored -> current`` for every result-affecting field that differs (execution fields ignored).

    A field missing from ``stored`` (written before the field existed) counts as its default, or as what such a
    run did where that is not the default (:data:`BEFORE_FIELD`).
    """
    defaults = {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(RunConfig)}
    defaults.update(BEFORE_FIELD)
    current = config.result_dict()
    return [f"{name} {stored.get(name, defaults[name])!r} -> {value!r}" for name, value in current.items()
            if name not in EXECUTION_FIELDS and stored.get(name, defaults[name]) != value]


def check_resume_config(run_dir: str, stored: Optional[Mapping[str, Any]], config: RunConfig) -> None:
    """Refuse, in one sentence, to resume ``run_dir`` with a config whose result would differ."""
    if stored is None:
        return
    changes = config_differences(stored, config)
    if changes:
        raise ConfigError(f"run directory {run_dir!r} holds a run with a different config ({'; '.join(changes)}); "
                          "expected the same config to resume it, or --force to continue it with the new one")
