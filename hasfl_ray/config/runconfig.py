"""RunConfig: the run configuration, resolved per dataset and algorithm, and what its ``auto`` values become.

It knows no algorithm or dataset: names are plain strings, checked and resolved through :mod:`hasfl_ray.registry`
(built-ins and plug-ins alike) by :meth:`RunConfig.resolved`, which the command line and the Engine call. Its fields
and their checks are :class:`~hasfl_ray.config.schema.RunConfigFields`."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping

from hasfl_ray import registry
from hasfl_ray.config.faults import fault_inject_round
from hasfl_ray.config.inputs import input_hashes
from hasfl_ray.config.migrate import CONFIG_VERSION, migrate_config
from hasfl_ray.config.routing import check_algorithm_options, route_options
from hasfl_ray.config.schema import RunConfigFields
from hasfl_ray.errors import RAY_INSTALL, ConfigError, expected_one_of
from hasfl_ray.federation import check_partition_applies

#: Local SGD momentum when ``momentum`` is left unset and the algorithm sets none (``Algorithm.resolve_config``:
#: SCAFFOLD's is 0; docs/algorithms.md).
DEFAULT_MOMENTUM = 0.9

#: The learning rate's factor a round when ``lr_decay`` is left unset and the algorithm sets none (DepthFL sets
#: its depthfl_lr_decay); a value given, this one included, is kept (docs/configs.md).
DEFAULT_LR_DECAY = 0.995

#: The sub-model a client trains when ``sub_model`` is left unset and the algorithm sets none (DepthFL: depth,
#: ScaleFL: width_depth); a value given, this one included, is kept or refused by the algorithm, never replaced.
DEFAULT_SUB_MODEL = "width"

#: Fields that never change a run's result: recorded in config.yaml, ignored when --resume compares configs.
#: (data_dir is where the data are, not what they are: their content is compared through data_fingerprint.)
#: (device, trainer_threads and aggregation_backend can change the last bits of floats, so they are compared.)
EXECUTION_FIELDS = frozenset({"backend", "actors", "gpus_per_actor", "address", "server_placement",
                              "checkpoint_every", "fault_inject",
                              "data_dir", "download", "control_variates_dir",
                              # evaluation beside test_accuracy (docs/metrics.md): never changes the model or it
                              "eval_widths", "eval_every", "test_every", "test_first", "test_last", "test_phase",
                              "local_eval_every", "local_eval_width",
                              "eval_every_updates", "eval_every_seconds", "local_eval_clients", "handoff"})

#: eval_every's default per dataset (a dataset not named here, a plug-in's included: 5).
EVAL_EVERY = {"digits": 1, "synthetic": 1}

#: The protocol fields a dataset's ``defaults`` fill when the config leaves them unset (docs/plugins.md).
PROTOCOL_FIELDS = ("rounds", "local_epochs", "lr", "clip_norm", "batch_size")


@dataclass(frozen=True)
class RunConfig(RunConfigFields):
    """Everything that determines a run's result (and a few things that do not, like ``backend``).

    Fields left ``None`` take the dataset's protocol default in :meth:`resolved`. YAML config keys
    and ``hasfl-ray simulate`` flags use these field names (flags with dashes).

    The algorithm's own options (HAS-FL's p_min, FedProx's mu, a plug-in's) are not fields: each algorithm declares
    them as a dataclass (``Algorithm.options_class``) and they live in ``algorithm_options``. A flat key or flag
    (``mu: 0.5``, ``--mu 0.5``) names an option of the algorithm and is moved there (:func:`route_options`).
    """

    def resolved(self) -> "RunConfig":
        """This config with the dataset and algorithm looked up in the registry (one sentence when there is no
        such name or plug-in), every ``None`` protocol field replaced by the dataset's default (its plug-in's
        ``defaults``), the algorithm's own updates (``Algorithm.resolve_config``: SCAFFOLD's momentum,
        random-budget's budget), its ``algorithm_options`` checked and completed, device ``auto`` replaced by
        ``cuda`` where this process sees a GPU (``cpu`` otherwise), and client_batching and cuda_graphs ``auto`` by
        what :func:`auto_training_modes` picks for the device, and backend ``auto`` by :func:`default_backend`."""
        dataset = registry.lookup("dataset", self.dataset)
        algorithm = registry.lookup("algorithm", self.algorithm)
        check_partition_applies(dataset, registry.spec_label(self.dataset), self.partition)
        known = {f.name for f in fields(self)}
        optional = {f.name for f in fields(self) if f.default is None}  # the keys a config may leave unset
        for key in dataset.defaults:
            if key not in known:
                raise ConfigError(f"dataset {self.dataset!r} has default {key!r}; "
                                  f"{expected_one_of(key, sorted(known), 'a config key: one of')}")
            if key not in optional:  # a key with a default of its own is never None: the dataset's would never apply
                raise ConfigError(f"dataset {registry.spec_label(self.dataset)!r} has default {key}="
                                  f"{dataset.defaults[key]!r} but {key} has its own default, never replaced; expected "
                                  "defaults only for keys a config leaves unset, such as rounds or lr")
        # the protocol's before the algorithm's updates (it may read rounds), any other after them: a dataset's default
        # never stands for a value given, nor replaces what the algorithm sets (DepthFL's lr_decay, SCAFFOLD's momentum)
        updates = {k: v for k, v in dataset.defaults.items() if getattr(self, k) is None and k in PROTOCOL_FIELDS}
        later = {k: v for k, v in dataset.defaults.items() if getattr(self, k) is None and k not in PROTOCOL_FIELDS}
        options = registry.check_options("algorithm", self.algorithm, algorithm.options_class, self.algorithm_options)
        if options != self.algorithm_options:
            updates["algorithm_options"] = options
        if self.device == "auto":
            import torch

            updates["device"] = "cuda" if torch.cuda.is_available() else "cpu"
            if updates["device"] == "cpu" and self.gpus_per_actor is not None:
                raise ConfigError(f"gpus_per_actor is {self.gpus_per_actor!r} but device auto found no GPU; expected "
                                  "a machine with a GPU, or no --gpus-per-actor")
        if self.backend == "auto":
            updates["backend"] = default_backend()
            ray_only = [name for name in ("actors", "gpus_per_actor", "address", "server_placement", "fault_inject")
                        if getattr(self, name) is not None and (name != "fault_inject" or
                                                                 fault_inject_round(self.fault_inject) is not None)]
            if updates["backend"] == "local" and ray_only:
                raise ConfigError(f"{ray_only[0]} is {getattr(self, ray_only[0])!r} but Ray is not installed; install "
                                  f"it with `{RAY_INSTALL}`, or run with --backend local and without it")
        if self.handoff is None:  # the local-first start is the default backend's choice only: a named ray is Ray's
            updates["handoff"] = self.backend == "auto" and updates["backend"] == "ray"
        auto = auto_training_modes(updates.get("device", self.device))
        for name in ("client_batching", "cuda_graphs"):
            if getattr(self, name) == "auto":
                updates[name] = auto[name]
        label = registry.spec_label(self.algorithm)
        updates.update(registry.call_plugin(f"algorithm {label!r}", "resolve_config", algorithm.resolve_config,
                                            dataclasses.replace(self, **updates), check=dict,
                                            expected="a mapping of config fields to values", early=True))
        updates.update({k: v for k, v in later.items() if updates.get(k) is None})
        unset = [name for name in PROTOCOL_FIELDS if getattr(self, name) is None and updates.get(name) is None]
        if unset:  # a dataset plug-in without defaults: one sentence, never a TypeError in the first round
            raise ConfigError(f"{unset[0]} is not set and dataset {self.dataset!r} gives no default for it; expected "
                              f"--{unset[0].replace('_', '-')} (or {unset[0]}: in the config), or "
                              f"defaults = dict({unset[0]}=...) in the dataset plug-in")
        # the defaults of fields an algorithm may set (momentum, lr_decay, sub_model): None means "not given", so an
        # algorithm's value replaces no value given, and a value given equal to this default is kept (issue 44)
        for name, default in (("momentum", DEFAULT_MOMENTUM), ("lr_decay", DEFAULT_LR_DECAY),
                              ("sub_model", DEFAULT_SUB_MODEL)):
            if getattr(self, name) is None and updates.get(name) is None:
                updates[name] = default
        if self.eval_every is None:  # every round on the small datasets, every 5th on the others (docs/configs.md)
            updates["eval_every"] = EVAL_EVERY.get(self.dataset, 5)
        resolved = dataclasses.replace(self, **updates)
        hashes = input_hashes(resolved)  # the files it reads, by their content
        return resolved if hashes == resolved.input_sha256 else dataclasses.replace(resolved, input_sha256=hashes)

    @property
    def effective_data_seed(self) -> int:
        """The seed of the federation (the partition, the capacity tiers, the device population): ``data_seed``,
        or ``seed`` where it is unset (every run before the key existed, and a config.yaml reused with another
        --seed: its data follows that seed)."""
        return self.seed if self.data_seed is None else self.data_seed

    def to_dict(self) -> Dict[str, Any]:
        """Every field, after ``config_version`` (what config.yaml and a checkpoint store)."""
        values = {"config_version": CONFIG_VERSION, **dataclasses.asdict(self)}
        values["algorithm_options"] = dict(self.algorithm_options)
        return values

    def result_dict(self) -> Dict[str, Any]:
        """:meth:`to_dict` without :data:`EXECUTION_FIELDS`: what a run's result depends on (--resume compares it)."""
        return {k: v for k, v in self.to_dict().items() if k not in EXECUTION_FIELDS and k != "config_version"}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config", foreign: str = "refuse",
                  check_options: bool = True) -> "RunConfig":
        """Build a config from a mapping of config keys: flat keys that name the algorithm's options move into
        ``algorithm_options`` and unknown keys are refused, each in one sentence (:func:`route_options`; a key
        another built-in takes is refused, or dropped with ``foreign="drop"``, as config files and sweeps do). A
        stored config of an earlier version is read through :func:`migrate_config`."""
        values = migrate_config(values, source) if "config_version" in values else values
        config = cls(**route_options(values, source, foreign=foreign))
        if check_options:  # each option's type and range, before anything runs
            check_algorithm_options(config.algorithm, config.algorithm_options)
        return config


def ray_installed() -> bool:
    """Whether Ray can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def default_backend() -> str:
    """What ``backend: auto`` (the default of ``hasfl-ray simulate``, ``hasfl_ray.simulate`` and ``RunConfig``)
    becomes: ``ray`` where Ray is installed, else ``local``. Results do not depend on it (docs/design.md)."""
    return "ray" if ray_installed() else "local"


def auto_training_modes(device: str) -> Dict[str, str]:
    """What ``client_batching: auto`` and ``cuda_graphs: auto`` become on ``device``: never a mode a measurement
    shows slower.

    On CUDA: clients one at a time, each local step one CUDA-graph replay; batching off. The measurements (issue 17,
    NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, main at 020f01b; benchmarks/RESULTS.md):

    - EMNIST protocol round (20 clients, 10 a round): one at a time + graphs 0.70 s; batched 2.99 s (4.3x slower);
    - Shakespeare protocol round: graphed one at a time 34.3 s; batched did not finish in 150 s;
    - LSTM, 10 clients of width 0.5, batch 32: batched 0.30x one at a time;
    - CNN, 10-50 equal clients: batched 2.3-7.1x *eager* one at a time, never compared with graphed.

    No measurement shows batching ahead of graphed one-at-a-time training for any (model, group size), so ``auto``
    never batches; a new measurement that does belongs here, with the group sizes it holds for.

    On CPU (and MPS): both off (graphs need CUDA). Measured on the 2-core AMD EPYC (Zen 4) CPU, 2026-11-28, one
    thread, process CPU time, modes interleaved (issue 46 item 7; benchmarks/RESULTS.md, "Batching on a CPU"):

    - whole runs (HAS-FL, 20 rounds, the protocol's 10 clients a round): digits ``on`` 0.55x and ``mixed`` 0.61x
      the speed of ``off``, synthetic (the MLP) 0.27x and 0.31x; the EMNIST sample (3 rounds, 10 local steps)
      0.93x and 0.36x;
    - the EMNIST CNN (bench_training.py, steady state): a round of 20 clients at 8/5/4/3 over 4 widths ``on``
      1.00x and ``mixed`` 0.23x; 3 and 8 clients of width 0.5 batched 0.72x and 0.67x;
    - the digits CNN, steady state: the 20-client round ``on`` 1.46x and ``mixed`` 1.13x, since only width groups
      of 6 or more clients gain (1.58x at 6, 1.91x at 10; 0.75x at 3); the protocol's rounds hold none (10 clients
      over 4 tiers in the warm-up, continuous widths after), hence the whole runs' 0.55x and 0.61x; the MLP's
      20-client round likewise (``on`` 1.16x, ``mixed`` 1.46x) against its whole runs' 0.27x and 0.31x.

    So one at a time is the faster mode on this CPU wherever a run of the protocol's shape batches anything.
    """
    cuda = str(device).startswith("cuda")
    return {"client_batching": "off", "cuda_graphs": "on" if cuda else "off"}
