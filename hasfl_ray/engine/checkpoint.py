"""Atomic checkpoints of a run (RUN/checkpoints/latest.pt) and the config check that guards --resume."""

from __future__ import annotations

import glob
import io
import math
import os
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np
import torch
import yaml

from hasfl_ray.config import (EXECUTION_FIELDS, DuplicateKeyError, RunConfig, migrate_config, option_fields,
                              strict_yaml_load)
from hasfl_ray.config.inputs import changed_inputs, input_name
from hasfl_ray.engine.archive import damaged_record, save_with_crc
from hasfl_ray.data.fingerprint import data_change
from hasfl_ray.engine.rundir import history_line_problem
from hasfl_ray.errors import ConfigError
from hasfl_ray.files import atomic_write
from hasfl_ray.front_end import option

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
        clock: the device clock's state (:meth:`hasfl_ray.clock.Clock.state_dict`), None without one (and in a
            checkpoint written before the clock existed).
        server_state: a synchronous run's server-optimiser state (:meth:`Server.momentum_state`), None without one
            (an asynchronous run keeps it in ``clock["async"]["server_momentum"]``).
    """

    round: int
    params: Dict[str, torch.Tensor]
    algorithm_state: Dict[str, Any]
    history: List[Dict[str, Any]]
    config: Dict[str, Any]
    elapsed_s: float
    format_version: int = FORMAT_VERSION
    clock: Optional[Dict[str, Any]] = None
    server_state: Optional[Dict[str, Any]] = None


#: The most bytes of tensors and arrays the algorithm's and the clock's states may hold for a round that checkpoints
#: to be recorded after later rounds ran (:class:`Snapshot`); beyond it the round's checkpoint is written before the
#: next round begins.
SNAPSHOT_BYTES = 64 * 1024 ** 2


@dataclass
class Snapshot:
    """The run's state as a round that checkpoints ended, for its checkpoint written later (:meth:`Engine.snapshot`):
    a function giving the global parameters of that round, and copies of the algorithm's, the clock's and the server
    optimiser's state."""

    params: Callable[[], Dict[str, torch.Tensor]]
    algorithm_state: Dict[str, Any]
    clock: Optional[Dict[str, Any]]
    server_state: Optional[Dict[str, Any]] = None


def state_bytes(value: Any) -> int:
    """About the bytes a copy of ``value`` takes: its tensors' and numpy arrays' bytes, 64 per other item of its
    dicts, lists and tuples (nested), whose items are looked into only up to 10,000 of them."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (dict, list, tuple)):
        items = value.values() if isinstance(value, dict) else value
        if len(items) > 10_000:
            return 64 * len(items)
        return sum(state_bytes(item) or 64 for item in items)
    return 0


#: Checkpoint fields a file may lack (added after its format): their defaults stand in.
OPTIONAL_FIELDS = ("clock", "server_state")


def checkpoint_path(run_dir: str) -> str:
    return os.path.join(run_dir, CHECKPOINT_DIR, CHECKPOINT_FILE)


def save_checkpoint(run_dir: str, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` through a temporary file and a rename: a crash mid-write leaves the previous one whole."""
    directory = os.path.join(run_dir, CHECKPOINT_DIR)
    os.makedirs(directory, exist_ok=True)
    for stale in glob.glob(os.path.join(directory, ".tmp-*")):  # left by a process killed mid-write
        os.unlink(stale)
    buffer = io.BytesIO()
    save_with_crc(to_plain({f.name: getattr(checkpoint, f.name) for f in fields(checkpoint)}), buffer)  # no deep copy
    atomic_write(checkpoint_path(run_dir), buffer.getvalue())


#: What to do about a checkpoint that cannot be used: the end of every refusal's sentence.
def start_again() -> str:
    """The end of a checkpoint refusal's sentence, in the caller's words (:mod:`hasfl_ray.front_end`)."""
    return f"or {option('force')} without {option('resume')} to start again"


def load_checkpoint(run_dir: str) -> Optional[Checkpoint]:
    """The run directory's checkpoint, None when it has none; one sentence when it is unreadable, truncated,
    malformed, or holds a non-finite parameter (its match with the model is :func:`check_checkpoint`'s)."""
    path = checkpoint_path(run_dir)
    if not os.path.lexists(path):
        return None
    if os.path.islink(path):
        raise ConfigError(f"checkpoint {path!r} is a link to {os.readlink(path)!r}; expected the run's own file, "
                          f"{start_again()}")
    try:
        # Run directories travel between people and machines: the restricted unpickler builds tensors and plain
        # containers only, so a crafted file is refused before any of its code can run.
        values = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # any unpickling or archive problem means the file cannot be trusted
        text = str(error)
        if "weights_only" in text or "Unsupported global" in text:
            reason = "it holds objects other than tensors and plain values, which are never unpickled"
        elif isinstance(error, (EOFError, OSError)) or "PytorchStreamReader" in text or "zip archive" in text:
            size = os.path.getsize(path) if os.path.exists(path) else 0
            reason = f"it is truncated or corrupt: {size:,} bytes that do not unpack"
        else:
            reason = (text.strip().splitlines() or [type(error).__name__])[0][:120]
        raise ConfigError(f"checkpoint {path!r} cannot be read ({reason}); expected a whole hasfl-ray checkpoint, "
                          f"{start_again()}") from None
    damaged = damaged_record(path)
    if damaged is not None:
        raise ConfigError(f"checkpoint {path!r} cannot be read (it is corrupt: the bytes of its record {damaged!r} "
                          f"fail the CRC-32 check written with them); expected a whole hasfl-ray checkpoint, "
                          f"{start_again()}")
    problem = _malformed(values)
    if problem:
        raise ConfigError(f"checkpoint {path!r} cannot be used: {problem}; expected a hasfl-ray checkpoint, "
                          f"{start_again()}")
    return Checkpoint(**{f.name: from_plain(values[f.name]) for f in fields(Checkpoint) if f.name in values})


def _malformed(values: Any) -> Optional[str]:
    """What is wrong with the structure of a loaded checkpoint, None when nothing is: the fields and their types,
    history a list of metrics lines, every parameter a finite floating-point tensor."""
    if not isinstance(values, dict) or values.get("format_version") != FORMAT_VERSION:
        return f"it is not a hasfl-ray checkpoint of format {FORMAT_VERSION}"
    missing = [f.name for f in fields(Checkpoint) if f.name not in values and f.name not in OPTIONAL_FIELDS]
    if missing:
        return f"it has no {missing[0]}"
    kinds = {"round": int, "params": dict, "algorithm_state": dict, "history": list, "config": dict,
             "elapsed_s": (int, float)}
    for name, kind in kinds.items():
        if not isinstance(values[name], kind) or isinstance(values[name], bool):
            return f"its {name} is a {type(values[name]).__name__}"
    if values["round"] < 0:
        return f"its round is {values['round']}, not a count of rounds"
    if not all(isinstance(line, dict) for line in values["history"]):
        return "its history holds something other than metrics lines"
    if len(values["history"]) != values["round"]:
        return f"its round is {values['round']} but its history holds {len(values['history'])} rounds"
    for index, line in enumerate(values["history"]):
        problem = history_line_problem(line, index)
        if problem:
            return f"its history line {index} {problem}"
    for name, tensor in values["params"].items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            return f"parameter {name!r} is {_describe(tensor)}, not a float tensor"
        if not bool(torch.isfinite(tensor).all()):
            return f"parameter {name!r} holds {int((~torch.isfinite(tensor)).sum())} NaN or infinite values"
    return None


def check_checkpoint(path: str, checkpoint: Checkpoint, params: Mapping[str, torch.Tensor],
                     state: Mapping[str, Any]) -> None:
    """Refuse, in one sentence naming ``path``, a checkpoint whose parameters are not ``params``'s (the model's
    names, shapes and dtypes) or whose algorithm state does not match ``state``, a freshly built algorithm's
    :meth:`~hasfl_ray.algorithms.base.Algorithm.state_dict` (the schema: see :func:`state_mismatch`)."""
    def refuse(problem: str) -> ConfigError:
        return ConfigError(f"checkpoint {path!r} does not match this run: {problem}; expected this run's model and "
                           f"algorithm state, {start_again()}")

    missing = sorted(set(params) - set(checkpoint.params))
    extra = sorted(set(checkpoint.params) - set(params))
    if missing or extra:
        raise refuse(f"it lacks parameter {missing[0]!r}" if missing else f"it has parameter {extra[0]!r}, which the "
                     "model has not")
    for name, reference in params.items():
        tensor = checkpoint.params[name]
        if tuple(tensor.shape) != tuple(reference.shape) or tensor.dtype != reference.dtype:
            raise refuse(f"parameter {name!r} is {_describe(tensor)}, not the model's {_describe(reference)}")
    problem = state_mismatch(checkpoint.algorithm_state, state, "algorithm_state")
    if problem:
        raise refuse(problem)


def _describe(value: Any) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"{str(value.dtype).replace('torch.', '')} {list(value.shape)}"
    return f"a {type(value).__name__}"


def _tensor_kind(tensor: torch.Tensor) -> str:
    """numpy's dtype kind letter for a tensor: f(loat), c(omplex), b(ool) or i(nteger)."""
    return "f" if tensor.is_floating_point() else "c" if tensor.is_complex() else \
        "b" if tensor.dtype == torch.bool else "i"


def state_mismatch(value: Any, schema: Any, where: str) -> Optional[str]:
    """How ``value`` (a checkpoint's algorithm state) differs from ``schema`` (a fresh algorithm's), None when it
    does not: a mapping has the same keys (an empty one, like SCAFFOLD's per-client variates, any keys); a numpy
    array or tensor the same shape and kind of dtype, and finite values where the schema's are all finite; a number
    a number; a string a string; a list or tuple a list or tuple. Where the schema has None (state not made yet,
    like SCAFFOLD's layout before round 0) anything goes: the algorithm's own load_state_dict judges it."""
    if schema is None:
        return None
    if isinstance(schema, Mapping):
        if not isinstance(value, Mapping):
            return f"{where} is {_describe(value)}, not a mapping"
        if schema:
            missing = [k for k in schema if k not in value]
            extra = [k for k in value if k not in schema]
            if missing or extra:
                return f"{where} lacks {missing[0]!r}" if missing else f"{where} has an unknown {extra[0]!r}"
            for key in schema:
                problem = state_mismatch(value[key], schema[key], f"{where}[{key!r}]")
                if problem:
                    return problem
        return None
    if isinstance(schema, (np.ndarray, torch.Tensor)):
        numpy = isinstance(schema, np.ndarray)
        if not isinstance(value, np.ndarray if numpy else torch.Tensor):
            return f"{where} is {_describe(value)}, not {'an array' if numpy else 'a tensor'}"
        kind = (lambda a: a.dtype.kind) if numpy else _tensor_kind
        if tuple(value.shape) != tuple(schema.shape) or kind(value) != kind(schema):
            return f"{where} is {_describe(value)}, not {_describe(schema)}"
        if kind(schema) in "fc":
            finite = np.isfinite if numpy else torch.isfinite
            if bool(finite(schema).all()) and not bool(finite(value).all()):
                return f"{where} holds NaN or infinite values"
        return None
    if isinstance(schema, bool) or isinstance(schema, str):
        return None if type(value) is type(schema) else f"{where} is {value!r}, not a {type(schema).__name__}"
    if isinstance(schema, (int, float)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                (isinstance(schema, int) and not isinstance(value, int)):
            return f"{where} is {value!r}, not a{'n integer' if isinstance(schema, int) else ' number'}"
        if isinstance(value, float) and math.isfinite(schema) and not math.isfinite(value):
            return f"{where} is {value!r}, not a finite number"
        return None
    if isinstance(schema, (list, tuple)):
        return None if isinstance(value, (list, tuple)) else f"{where} is {_describe(value)}, not a list"
    return None


def load_checkpoint_round(run_dir: str) -> int:
    """Rounds completed by the run directory's readable checkpoint; 0 when it has none or it cannot be read."""
    try:
        checkpoint = load_checkpoint(run_dir)
    except ConfigError:
        return 0
    return checkpoint.round if checkpoint is not None else 0


#: Types :func:`to_plain` keeps as they are without looking further.
_PLAIN = (float, int, str, bool, type(None))


def to_plain(value: Any) -> Any:
    """``value`` with numpy arrays as tagged tensors and numpy scalars as Python numbers, so that
    ``torch.load(weights_only=True)`` can read it back (containers: dict, list, tuple)."""
    kind = type(value)
    if kind in _PLAIN:  # most of a checkpoint (its history's numbers): first, and as they are
        return value
    if kind is dict:
        return {key: to_plain(item) for key, item in value.items()}
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
    if is_dataclass(value) and not isinstance(value, type):  # as dataclasses.asdict would give it
        return {f.name: to_plain(getattr(value, f.name)) for f in fields(value)}
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
    """The config a run directory was written with, in the current version's keys (:func:`migrate_config`): the
    checkpoint's, else config.yaml's, else None."""
    if checkpoint is not None:
        return migrate_config(checkpoint.config, f"the checkpoint's config in {run_dir!r}")
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
    return migrate_config(values, f"config file {path!r}") if isinstance(values, dict) else None


#: What a run written before a field existed did, where the field's default (``auto``) would resolve otherwise.
#: (sub_model and lr_decay: None is "not given" now, RunConfig.resolved; a run before either key trained width slices
#: at 0.995, the defaults of then.)
BEFORE_FIELD: Dict[str, Any] = {"cuda_graphs": "off",  # before --cuda-graphs, every step ran eagerly
                                "sub_model": "width", "lr_decay": 0.995}


def config_differences(stored: Mapping[str, Any], config: RunConfig) -> List[str]:
    """``name: stored -> current`` for every result-affecting field that differs (execution fields ignored).

    A field missing from ``stored`` (written before the field existed) counts as its default, or as what such a
    run did where that is not the default (:data:`BEFORE_FIELD`). The algorithm's options are compared one by one
    (``mu 1.0 -> 0.5``), a missing one as its default.
    """
    defaults = {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(RunConfig)}
    defaults.update(BEFORE_FIELD)
    current = config.result_dict()
    changes = [f"{name} {stored.get(name, defaults[name])!r} -> {value!r}" for name, value in current.items()
               if name not in EXECUTION_FIELDS and name not in ("algorithm_options", "input_sha256", "data_seed",
                                                                  "data_fingerprint")
               and stored.get(name, defaults[name]) != value]
    given = stored.get("data_seed"), config.data_seed  # unset (or a run of before the key): the seed's, as drawn;
    before = stored.get("seed", defaults["seed"]) if given[0] is None else given[0]  # both unset: the seed's change
    if before != config.effective_data_seed and given != (None, None):  # says it
        changes.append(f"data_seed {before!r} -> {config.effective_data_seed!r}")
    if "input_sha256" in stored:  # a run written before inputs were hashed is not checked on them
        old, new = stored.get("input_sha256") or {}, current.get("input_sha256") or {}
        for name in changed_inputs(old, new):
            changes.append(f"{input_name(name, stored)} changed since the run began (sha256 "
                           f"{str(old.get(name))[:12]} -> {str(new.get(name))[:12]})")
    data = data_change(stored, config)  # compared once both are known (a run of before it: not checked)
    if data is not None:
        changes.append(data)
    if stored.get("algorithm", defaults["algorithm"]) == config.algorithm:
        option_defaults = option_fields(config.algorithm)
        old = stored.get("algorithm_options") or {}
        old = old if isinstance(old, Mapping) else {}
        new = dict(config.algorithm_options)
        for name in list(new) + [k for k in old if k not in new]:
            before, after = old.get(name, option_defaults.get(name)), new.get(name, option_defaults.get(name))
            if before != after:
                changes.append(f"{name} {before!r} -> {after!r}")
    return changes


def check_resume_config(run_dir: str, stored: Optional[Mapping[str, Any]], config: RunConfig) -> None:
    """Refuse, in one sentence, to resume ``run_dir`` with a config whose result would differ."""
    if stored is None:
        return
    changes = config_differences(stored, config)
    if changes:
        raise ConfigError(f"run directory {run_dir!r} holds a run with a different config ({'; '.join(changes)}); "
                          f"expected the same config to resume it, or {option('force')} to continue it with the new "
                          "one")
