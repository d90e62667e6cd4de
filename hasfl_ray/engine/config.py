"""The run configuration: one frozen dataclass, validated on construction, resolved per dataset and algorithm.

It sits at the bottom of the package and knows no algorithm or dataset: names are plain strings here, checked and
resolved through :mod:`hasfl_ray.registry` (built-ins and plug-ins alike) by :meth:`RunConfig.resolved`, which the
command line and the Engine call. It also reads config files (:func:`load_yaml_config`), a sweep config's
included: :func:`single_run_values` is the one run ``simulate --config`` takes from it, so a plain run needs no sweep
code (:mod:`hasfl_ray.sweep` plans the cells)."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import re
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from hasfl_ray import registry
from hasfl_ray.errors import RAY_INSTALL, ConfigError, DataError, expected_one_of
from hasfl_ray.federation import (PAPER_WIDTHS, WIDTH_ASSIGNMENTS, check_partition_applies, normalise_ladder,
                                  normalise_partition)
from hasfl_ray.files import open_regular

#: Local SGD momentum when ``momentum`` is left unset and the algorithm sets none (``Algorithm.resolve_config``:
#: SCAFFOLD's is 0; docs/algorithms.md).
DEFAULT_MOMENTUM = 0.9

#: The version of the config.yaml a run writes (``config_version:``). 1 (no key): every built-in's options as flat keys
#: beside the protocol's (:data:`LEGACY_OPTION_KEYS`); 2: the algorithm's own options only, in ``algorithm_options``
#: (:func:`migrate_config` reads 1 as 2).
CONFIG_VERSION = 2

#: The built-in algorithms' options that were RunConfig fields before config_version 2: a config.yaml of version 1
#: holds all of them, whichever algorithm ran. Frozen: the migration reads old files, whatever the options are now.
LEGACY_OPTION_KEYS = ("coverage", "p_min", "gamma", "beta", "t_norm", "epsilon", "mu", "budget", "budget_from",
                      "heterofl_weighting", "fjord_distill_weight", "scaffold_global_lr", "rolex_step")

#: Fields that never change a run's result: recorded in config.yaml, ignored when --resume compares configs.
#: (device, trainer_threads and aggregation_backend can change the last bits of floats, so they are compared.)
EXECUTION_FIELDS = frozenset({"backend", "actors", "gpus_per_actor", "address", "checkpoint_every", "fault_inject",
                              "data_dir", "download", "control_variates_dir",
                              # evaluation beside test_accuracy (docs/metrics.md): never changes the model or it
                              "eval_widths", "eval_every", "local_eval_every", "local_eval_width"})

#: The networks ``model`` may name and their normalisations (hasfl_ray.models.resnet; docs/models.md).
MODEL_CHOICES = ("preresnet18", "resnet18")
MODEL_NORMS = ("sbn", "bn", "gn", "none")

#: eval_every's default per dataset (a dataset not named here, a plug-in's included: 5).
EVAL_EVERY = {"digits": 1, "synthetic": 1}

#: FLOAT32_MAX and MAX_LR: the bounds of every real-valued key and option (hasfl_ray.registry, shared with the
#: algorithms' options).
FLOAT32_MAX, MAX_LR = registry.FLOAT32_MAX, registry.MAX_LR


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's result (and a few things that do not, like ``backend``).

    Fields left ``None`` take the dataset's protocol default in :meth:`resolved`. YAML config keys
    and ``hasfl-ray simulate`` flags use these field names (flags with dashes).

    The algorithm's own options (HAS-FL's p_min, FedProx's mu, a plug-in's) are not fields: each algorithm declares
    them as a dataclass (``Algorithm.options_class``) and they live in ``algorithm_options``. A flat key or flag
    (``mu: 0.5``, ``--mu 0.5``) names an option of the algorithm and is moved there (:func:`route_options`).
    """

    dataset: str = "digits"  # a registered name or a plug-in, FILE.py:Class or MODULE:Class
    data_dir: Optional[str] = None
    download: bool = False
    algorithm: str = "hasfl"  # a registered name or a plug-in, FILE.py:Class or MODULE:Class
    # the algorithm's own options (its options_class dataclass, built-in or plug-in), by name; complete once resolved
    algorithm_options: Dict[str, Any] = field(default_factory=dict)
    rounds: Optional[int] = None
    clients: int = 20
    clients_per_round: int = 10
    seed: int = 42
    alpha: float = 0.3
    # clients per capacity tier p^max 0.25/0.5/0.75/1.0 (None: the text's 8/5/4/3 of 20 by largest remainder;
    # [4, 10, 3, 3] is the mix of the paper's own runs, its Figure 5)
    tier_counts: Optional[List[int]] = None
    # the width ladder p^max comes from (hasfl_ray/federation.py, docs/configs.md#width-ladder): widths (None: the
    # paper's tiers 0.25/0.5/0.75/1.0), width_mix (each width's share of the clients, or HeteroFL's notation
    # a1-b1-c1-d1-e1, which names the widths too; None: the paper's 0.40/0.25/0.20/0.15 for its tiers, equal shares
    # for other widths; tier_counts gives exact counts instead), and whether a client's p^max is drawn once for the
    # run (fixed) or redrawn from the mix every round (dynamic, HeteroFL's "dynamic")
    widths: Optional[List[float]] = None
    width_mix: Optional[Any] = None
    width_assignment: str = "fixed"
    # the label partition of the image sets: dirichlet (label skew of alpha), iid, classes:K (K classes per client,
    # HeteroFL's non-IID-K) or shards:S (S label-sorted shards per client, McMahan et al.); docs/datasets.md
    partition: str = "dirichlet"
    # the network trained (docs/models.md): None = the dataset's own model; preresnet18 (HeteroFL's pre-activation
    # ResNet-18) or resnet18 (FjORD's post-activation ResNet-18), on an image dataset, with model_norm sbn (static
    # BatchNorm, the default), bn (batch statistics), gn (GroupNorm) or none, and model_scaler on (default) or off
    model: Optional[str] = None
    model_norm: Optional[str] = None
    model_scaler: Optional[str] = None
    # FedProx's Synthetic(alpha, beta) data (--dataset synthetic): labeller and input heterogeneity
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    # local optimisation
    local_epochs: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    lr_decay: float = 0.995
    momentum: Optional[float] = None
    weight_decay: float = 1e-4
    clip_norm: Optional[float] = None
    eval_batch_size: int = 500
    # evaluate on a seeded subset of this many test samples, the same every round (None or 0: the whole test set)
    eval_samples: Optional[int] = None
    # the global model cut to each of these widths is evaluated too (None: the distinct p^max of the run's tiers and
    # 1.0; [1.0]: the full model only), every eval_every rounds (None: the dataset's default, 1 on digits and
    # synthetic, else 5) and after the last; each client's local accuracy after the last round and every
    # local_eval_every rounds (0: the last only), at its final p or its p^max (local_eval_width)
    eval_widths: Optional[List[float]] = None
    eval_every: Optional[int] = None
    local_eval_every: int = 0
    local_eval_width: str = "final"
    # the adaptation schedule (HAS-FL's and random-budget's; the engine's post-warm-up avg_p and coverage monitor
    # count from it): warm-up rounds at p^max, then an adaptation at every t >= warmup with t % t_adapt == 0
    t_adapt: int = 5
    warmup: int = 10
    # divergence estimator Ĥ_i: masked (client i's own coordinates, the paper's Eq. 5) or common-core (only the
    # coordinates every participant of the round covers; Section 4's second variant)
    estimator: str = "masked"
    # execution (does not change results); auto: default_backend(), the one rule of the CLI and the Python API
    backend: str = "auto"
    aggregation_backend: str = "auto"
    trainer_threads: int = 1
    device: str = "auto"
    # local training of the clients of one width as one batched computation (auto = off: auto_training_modes;
    # mixed: of every width, padded to the widest); agrees with one-at-a-time training to float tolerance, so it is
    # compared by --resume
    client_batching: str = "auto"
    # a whole local step captured once as a CUDA graph and replayed, for the clients trained one at a time whose
    # objective allows it (auto = on for CUDA, off on CPU; on with a CPU device runs the same static-buffer step
    # eagerly, with identical results); compared by --resume (a run written before it existed trained eagerly: off)
    cuda_graphs: str = "auto"
    # bit-identical CUDA runs (deterministic cuBLAS/cuDNN, no autotuning); False = --fast-nondeterministic
    deterministic: bool = True
    # Ray backend, checkpoints and fault injection (never change results; not compared by --resume)
    actors: Optional[int] = None
    gpus_per_actor: Optional[float] = None
    address: Optional[str] = None
    checkpoint_every: int = 10
    fault_inject: Optional[str] = None
    control_variates_dir: Optional[str] = None
    # the device clock (docs/clock.md; off while devices is None): the device population (a trace PATH.csv,
    # lognormal or pareto, or a mapping with trace, tiers or distribution), the availability model (None: the
    # trace's intervals where it gives them, else always; always, trace or markov:ON,OFF), the deadline in simulated
    # seconds and what becomes of a late update (drop, partial or overselect with its fraction F), and the
    # probability an invited client drops out mid-round
    devices: Optional[Any] = None
    availability: Optional[str] = None
    deadline: Optional[float] = None
    deadline_policy: str = "drop"
    overselect: Optional[float] = None
    dropout: float = 0.0

    def __post_init__(self) -> None:
        def bad(name: str, value: Any, expected: str) -> ConfigError:
            if _real(value) and not _number(value) and "at most" not in expected:  # NaN, infinity, 1e39
                expected += ", and finite (not NaN or infinity; at most 3.4e+38 in size, float32's largest)"
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:20] + f"... ({len(repr(value))} characters)"
            return ConfigError(f"{name} is {shown}; expected {expected}")

        for name in ("dataset", "algorithm"):  # which names exist is the registry's business (resolved())
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise bad(name, getattr(self, name), "a registered name or FILE.py:Class / MODULE:Class")
        if not isinstance(self.algorithm_options, Mapping) or \
                not all(isinstance(k, str) for k in self.algorithm_options):
            raise bad("algorithm_options", self.algorithm_options, "a mapping of option names to values")
        for name in ("clients", "clients_per_round", "eval_batch_size", "t_adapt", "trainer_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise bad(name, value, "a positive integer")
        if self.eval_samples is not None:
            value = self.eval_samples
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise bad("eval_samples", value, "a positive integer (test samples to evaluate on), or 0 for the "
                                                 "whole test set")
            if value == 0:  # one spelling of "the whole test set" in config.yaml and --resume's comparison
                object.__setattr__(self, "eval_samples", None)
        self._check_evaluation(bad)
        for name in ("rounds", "local_epochs", "batch_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise bad(name, value, "a positive integer")
        if self.clients_per_round > self.clients:
            raise ConfigError(f"clients_per_round is {self.clients_per_round} but clients is {self.clients}; "
                              "expected at most as many participants per round as clients")
        self._check_ladder(bad)
        if self.estimator not in ("masked", "common-core"):
            raise bad("estimator", self.estimator, "masked or common-core")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise bad("warmup", self.warmup, "a non-negative integer")
        if not _positive_number(self.alpha):
            raise bad("alpha", self.alpha, "a number > 0")
        if self.lr is not None and (not _positive_number(self.lr) or self.lr > MAX_LR):
            raise bad("lr", self.lr, f"a number > 0 and at most {MAX_LR:g} (a larger step overflows float32 weights)")
        for name, low, high in (("lr_decay", 0, 1), ("momentum", 0, 1)):
            value = getattr(self, name)
            if (value is not None or name != "momentum") and (not _number(value) or not low <= value <= high):
                raise bad(name, value, f"a number in [{low}, {high}]")
        if not _number(self.weight_decay) or self.weight_decay < 0:
            raise bad("weight_decay", self.weight_decay, "a number >= 0")
        if self.clip_norm is not None and (not _number(self.clip_norm) or self.clip_norm < 0):
            raise bad("clip_norm", self.clip_norm, "a number >= 0 (0 disables clipping)")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise bad("seed", self.seed, "a non-negative integer")
        value = self.control_variates_dir
        if value is not None and (not isinstance(value, str) or not value):
            raise bad("control_variates_dir", value, "a directory path")
        if self.backend not in ("auto", "local", "ray"):
            raise bad("backend", self.backend, "auto, local or ray")
        if self.aggregation_backend not in ("auto", "fused", "reference"):
            raise bad("aggregation_backend", self.aggregation_backend, "auto, fused or reference")
        if self.client_batching not in ("auto", "on", "mixed", "off"):
            raise bad("client_batching", self.client_batching, "auto, on, mixed or off")
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise bad("cuda_graphs", self.cuda_graphs, "auto, on or off")
        self._check_model(bad)
        self._check_execution(bad)
        self._check_clock()

    def _check_model(self, bad) -> None:
        """Validate model, model_norm and model_scaler (docs/models.md); the dataset's inputs are checked by the
        Engine once it is loaded."""
        if self.model is not None and self.model not in MODEL_CHOICES and not registry.is_spec(self.model):
            raise bad("model", self.model, f"one of {', '.join(MODEL_CHOICES)}, or a plug-in model FILE.py:Class or "
                                           "MODULE:Class (or unset: the dataset's own model)")
        if isinstance(self.model_scaler, bool):
            object.__setattr__(self, "model_scaler", "on" if self.model_scaler else "off")
        for name, allowed in (("model_norm", MODEL_NORMS), ("model_scaler", ("on", "off"))):
            value = getattr(self, name)
            if value is None:
                continue
            if value not in allowed:
                raise bad(name, value, f"one of {', '.join(allowed)}")
            if self.model is None:
                raise ConfigError(f"{name} is {value!r} but model is unset; expected it only with model "
                                  f"{' or '.join(MODEL_CHOICES)} (the datasets' own models have fixed layers)")
            if self.model not in MODEL_CHOICES:  # a plug-in model (docs/plugins.md#models) has its own layers
                raise ConfigError(f"{name} is {value!r} but model is the plug-in {self.model!r}; expected it only "
                                  f"with model {' or '.join(MODEL_CHOICES)}")

    def _check_ladder(self, bad) -> None:
        """Validate (and normalise) widths, width_mix, tier_counts, width_assignment and partition."""
        widths, mix = normalise_ladder(self.widths, self.width_mix)
        object.__setattr__(self, "widths", widths)
        object.__setattr__(self, "width_mix", mix)
        if self.tier_counts is not None:
            counts, tiers = self.tier_counts, widths or list(PAPER_WIDTHS)
            if not isinstance(counts, (list, tuple)) or len(counts) != len(tiers) or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts) or \
                    sum(counts) != self.clients:
                raise bad("tier_counts", counts, f"{len(tiers)} non-negative client counts for p^max "
                                                 f"{'/'.join(map(str, tiers))} adding up to clients ({self.clients})"
                                                 + (", e.g. [4, 10, 3, 3] for 20" if widths is None else ""))
            if mix is not None:
                raise ConfigError(f"tier_counts is {list(counts)!r} and width_mix is {self.width_mix!r}; expected one "
                                  "of them (tier_counts: exact client counts per width; width_mix: shares)")
            object.__setattr__(self, "tier_counts", [int(n) for n in counts])
        if self.width_assignment not in WIDTH_ASSIGNMENTS:
            raise bad("width_assignment", self.width_assignment, "fixed (a client's p^max drawn once for the run) or "
                                                                 "dynamic (redrawn from the mix every round)")
        object.__setattr__(self, "partition", normalise_partition(self.partition))

    def _check_evaluation(self, bad) -> None:
        """Validate (and normalise) eval_widths, eval_every, local_eval_every and local_eval_width."""
        widths = self.eval_widths
        if widths is not None:
            if not isinstance(widths, (list, tuple)) or not widths or not all(
                    _number(w) and not isinstance(w, bool) and 0 < w <= 1 for w in widths):
                raise bad("eval_widths", widths, "a list of widths in (0, 1], e.g. [0.25, 0.5, 1.0] (1.0 is always "
                                                 "evaluated)")
            object.__setattr__(self, "eval_widths", sorted({float(w) for w in widths} | {1.0}))
        value = self.eval_every
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise bad("eval_every", value, "a positive integer (rounds between evaluations at each width)")
        value = self.local_eval_every
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad("local_eval_every", value, "a non-negative integer (rounds between local-accuracy evaluations; "
                                                 "0: after the last round only)")
        if self.local_eval_width not in ("final", "p_max"):
            raise bad("local_eval_width", self.local_eval_width, "final or p_max")

    def _check_clock(self) -> None:
        """Validate (and normalise) the device clock's fields (:func:`hasfl_ray.clock.spec.check_clock_keys`)."""
        from hasfl_ray.clock.spec import check_clock_keys

        values = check_clock_keys(self.devices, self.availability, self.deadline, self.deadline_policy,
                                  self.overselect, self.dropout)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _check_execution(self, bad) -> None:
        """Validate the synthetic-data, Ray, checkpoint and fault-injection fields."""
        for name in ("synthetic_alpha", "synthetic_beta"):
            if not _number(getattr(self, name)) or getattr(self, name) < 0:
                raise bad(name, getattr(self, name), "a number >= 0")
        if not isinstance(self.deterministic, bool):
            raise bad("deterministic", self.deterministic, "true or false")
        if not isinstance(self.device, str) or not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device):
            raise bad("device", self.device, "auto, cpu, cuda, cuda:N or mps")
        if self.actors is not None and (not isinstance(self.actors, int) or isinstance(self.actors, bool)
                                        or self.actors <= 0):
            raise bad("actors", self.actors, "a positive integer")
        gpus = self.gpus_per_actor
        if gpus is not None:
            if not _number(gpus) or gpus <= 0 or (gpus > 1 and gpus != int(gpus)):
                raise bad("gpus_per_actor", gpus, "a fraction in (0, 1] or a whole number of GPUs")
            if not self.device.startswith(("cuda", "auto")):
                raise ConfigError(f"gpus_per_actor is {gpus!r} but device is {self.device!r}; expected device cuda "
                                  "for trainers that use GPUs")
        if self.address is not None and (not isinstance(self.address, str) or not self.address):
            raise bad("address", self.address, "a Ray cluster address HOST:PORT, ray://HOST:PORT or auto")
        for name in ("actors", "gpus_per_actor", "address"):
            if getattr(self, name) is not None and self.backend == "local":
                raise ConfigError(f"{name} is {getattr(self, name)!r} but backend is {self.backend!r}; expected "
                                  "backend ray, the only one with actors")
        if not isinstance(self.checkpoint_every, int) or isinstance(self.checkpoint_every, bool) or \
                self.checkpoint_every < 0:
            raise bad("checkpoint_every", self.checkpoint_every, "a non-negative integer (0 disables checkpoints)")
        if self.fault_inject is not None:
            fault = parse_fault(self.fault_inject)
            if fault is None:
                raise bad("fault_inject", self.fault_inject, "KIND@ROUND with KIND one of " + ", ".join(FAULT_KINDS))
            if fault[0] == "kill-trainer" and self.backend == "local":
                raise ConfigError(f"fault_inject is {self.fault_inject!r} but backend is {self.backend!r}; expected "
                                  "backend ray, whose trainer actors it kills")

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
        for key in dataset.defaults:
            if key not in known:
                raise ConfigError(f"dataset {self.dataset!r} has default {key!r}; "
                                  f"{expected_one_of(key, sorted(known), 'a config key: one of')}")
        updates = {k: v for k, v in dataset.defaults.items() if getattr(self, k) is None}
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
            ray_only = [name for name in ("actors", "gpus_per_actor", "address", "fault_inject")
                        if getattr(self, name) is not None and (name != "fault_inject" or
                                                                 fault_inject_round(self.fault_inject) is not None)]
            if updates["backend"] == "local" and ray_only:
                raise ConfigError(f"{ray_only[0]} is {getattr(self, ray_only[0])!r} but Ray is not installed; install "
                                  f"it with `{RAY_INSTALL}`, or run with --backend local and without it")
        auto = auto_training_modes(updates.get("device", self.device))
        for name in ("client_batching", "cuda_graphs"):
            if getattr(self, name) == "auto":
                updates[name] = auto[name]
        label = registry.spec_label(self.algorithm)
        updates.update(registry.call_plugin(f"algorithm {label!r}", "resolve_config", algorithm.resolve_config,
                                            dataclasses.replace(self, **updates), check=dict,
                                            expected="a mapping of config fields to values", early=True))
        unset = [name for name in PROTOCOL_FIELDS if getattr(self, name) is None and updates.get(name) is None]
        if unset:  # a dataset plug-in without defaults: one sentence, never a TypeError in the first round
            raise ConfigError(f"{unset[0]} is not set and dataset {self.dataset!r} gives no default for it; expected "
                              f"--{unset[0].replace('_', '-')} (or {unset[0]}: in the config), or "
                              f"defaults = dict({unset[0]}=...) in the dataset plug-in")
        if self.momentum is None and updates.get("momentum") is None:
            updates["momentum"] = DEFAULT_MOMENTUM
        if self.eval_every is None:  # every round on the small datasets, every 5th on the others (docs/configs.md)
            updates["eval_every"] = EVAL_EVERY.get(self.dataset, 5)
        return dataclasses.replace(self, **updates)

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


def check_algorithm_options(algorithm: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """``options`` checked against ``algorithm``'s options dataclass (:func:`hasfl_ray.registry.check_options`):
    the complete options, or one sentence."""
    return registry.check_options("algorithm", algorithm, registry.lookup("algorithm", algorithm).options_class,
                                  options)


def option_fields(algorithm: str) -> Dict[str, Any]:
    """The options ``algorithm`` (a registered name or a plug-in spec) declares, name -> default (empty when it
    declares none); one sentence when there is no such algorithm."""
    options_class = registry.lookup("algorithm", algorithm).options_class
    if options_class is None:
        return {}
    return {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
            for f in fields(options_class)}


def option_owners() -> Dict[str, List[str]]:
    """Each built-in algorithm's option name -> the built-ins that declare it (``coverage`` -> hasfl,
    random-budget)."""
    owners: Dict[str, List[str]] = {}
    for name in registry.registered("algorithm"):
        for option in option_fields(name):
            owners.setdefault(option, []).append(name)
    return owners


def route_options(values: Mapping[str, Any], source: str = "config", foreign: str = "refuse") -> Dict[str, Any]:
    """``values`` with every key that is not a RunConfig field but an option of the algorithm (``mu`` with
    fedprox, ``gain`` with a plug-in that declares it) moved into ``algorithm_options``.

    One sentence (ConfigError) for a key given both ways, for an unknown key, and for an option another built-in
    declares but this algorithm does not (``mu`` with hasfl): unless ``foreign="drop"``, which drops it (config
    files shared by the algorithms of a sweep, and stored configs of version 1)."""
    known = {f.name for f in fields(RunConfig)}
    flat = [k for k in values if k not in known]
    if not flat:
        return dict(values)
    algorithm = values.get("algorithm", RunConfig.algorithm)
    own = option_fields(algorithm) if isinstance(algorithm, str) and algorithm else {}
    given = values.get("algorithm_options")
    options = dict(given) if isinstance(given, Mapping) else {}
    owners = option_owners()
    for key in flat:
        if key in own:
            if key in options:
                raise ConfigError(f"{source} gives {key!r} both as a key ({values[key]!r}) and in algorithm_options "
                                  f"({options[key]!r}); expected it once")
            options[key] = values[key]
        elif key in owners:
            if foreign == "drop":  # still a sound value for the algorithm that takes it: `mu: .inf` is a mistake
                check_algorithm_options(owners[key][0], {key: values[key]})
                continue
            takers = owners[key]
            raise ConfigError(f"{key} is {values[key]!r} but algorithm {algorithm!r} takes no option {key!r}; "
                              f"expected it only with {' or '.join(takers)}"
                              + (f" (the options of {algorithm!r}: {', '.join(own)})" if own else ""))
        else:
            choices = sorted(known | set(own) | set(owners))
            raise ConfigError(f"{source} has unknown key {key!r}; "
                              f"{expected_one_of(key, choices, 'a config key: one of')}")
    out = {k: v for k, v in values.items() if k in known}
    if given is not None and not isinstance(given, Mapping):
        out["algorithm_options"] = given  # RunConfig names the bad value
    elif options or given is not None:
        out["algorithm_options"] = options
    return out


def migrate_config(values: Mapping[str, Any], source: str = "stored config") -> Dict[str, Any]:
    """A stored config (a run's config.yaml, a checkpoint's config) of any version, as a mapping of the current
    version's keys, without ``config_version``.

    Version 1 (no ``config_version``) stored every built-in's options as flat keys (:data:`LEGACY_OPTION_KEYS`),
    whichever algorithm ran: those of the run's algorithm move into ``algorithm_options`` (an entry already there
    wins), the others are dropped, since that algorithm never read them. A plug-in's options were always in
    ``algorithm_options``. A version newer than :data:`CONFIG_VERSION` is refused in one sentence."""
    version = values.get("config_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= CONFIG_VERSION:
        raise ConfigError(f"{source} has config_version {version!r}; expected 1 to {CONFIG_VERSION} (a newer "
                          "hasfl-ray wrote it?)")
    out = {k: v for k, v in values.items() if k != "config_version"}
    if version >= 2:
        return out
    algorithm = values.get("algorithm", RunConfig.algorithm)
    own: Dict[str, Any] = {}
    if isinstance(algorithm, str) and algorithm and not registry.is_spec(algorithm):
        try:
            own = option_fields(algorithm)
        except ConfigError:  # an algorithm this version lacks: RunConfig.resolved names it
            own = {}
    for key in LEGACY_OPTION_KEYS:
        out.pop(key, None)
    given = values.get("algorithm_options")
    if given is None or isinstance(given, Mapping):  # anything else is left for RunConfig to name
        out["algorithm_options"] = {**{k: values[k] for k in LEGACY_OPTION_KEYS if k in values and k in own},
                                    **(given or {})}
    return out


def merge_layers(layers: Sequence[Tuple[Mapping[str, Any], str]], source: str = "config") -> Dict[str, Any]:
    """One mapping of config keys from ``(values, foreign)`` layers, later over earlier (a resumed run's config, a
    config file, flags): each layer's flat keys are routed (:func:`route_options`) for the algorithm the layers end
    with, and ``algorithm_options`` merge key by key. A layer's ``algorithm_options`` mapping counts only when the
    layer names that algorithm or none (a resumed HAS-FL run's options do not follow ``--algorithm fedprox``)."""
    algorithm = RunConfig.algorithm
    for values, _ in layers:
        algorithm = values.get("algorithm", algorithm)
    out: Dict[str, Any] = {}
    options: Dict[str, Any] = {}
    have_options = False
    for values, foreign in layers:
        if "config_version" in values:  # a run's config.yaml given as a config file
            values = migrate_config(values, source)
        given = values.get("algorithm_options")
        if given is not None and not isinstance(given, Mapping):
            return {**out, **values}  # RunConfig names the bad value
        if values.get("algorithm", algorithm) != algorithm:  # another algorithm's options mapping does not follow
            values = {k: v for k, v in values.items() if k != "algorithm_options"}
        routed = route_options({**values, "algorithm": algorithm}, source, foreign)
        if "algorithm" not in values:
            routed.pop("algorithm")
        if "algorithm_options" in routed:
            options.update(routed.pop("algorithm_options"))
            have_options = True
        out.update(routed)
    if have_options:
        out["algorithm_options"] = options
    return out


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
    never batches; a new measurement that does belongs here, with the group sizes it holds for. On CPU (and MPS):
    both off, since neither has a launch cost to save (and graphs need CUDA).
    """
    cuda = str(device).startswith("cuda")
    return {"client_batching": "off", "cuda_graphs": "on" if cuda else "off"}


#: The protocol fields a dataset's ``defaults`` fill when the config leaves them unset (docs/plugins.md).
PROTOCOL_FIELDS = ("rounds", "local_epochs", "lr", "clip_norm", "batch_size")


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping names one key twice (plain YAML would keep the last value without a word)."""

    def __init__(self, key: Any, mark: Any):
        super().__init__(problem=f"found the key {key!r} twice", problem_mark=mark)
        self.key = key


#: The most values a YAML file's aliases (``*name``) may add by repeating what their anchors (``&name``) name: a
#: config that repeats a block of settings a few times stays far below it, while an alias bomb (ten lines, each
#: repeating the line before nine times: 9^9 values, gigabytes once anything walks or prints them) is refused
#: before a value is built.
MAX_ALIAS_EXPANSION = 100_000


class AliasExpansionError(yaml.composer.ComposerError):
    """A YAML document whose aliases expand beyond :data:`MAX_ALIAS_EXPANSION` values, or name a node that holds
    them (a structure that contains itself)."""

    def __init__(self, problem: str, mark: Any):
        super().__init__(problem=problem, problem_mark=mark)


def _yaml_children(node: yaml.Node) -> List[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def check_alias_expansion(root: yaml.Node) -> None:
    """Raise :class:`AliasExpansionError` when the composed document ``root`` holds more than
    :data:`MAX_ALIAS_EXPANSION` values beyond its own nodes once every alias is expanded, or an alias inside the
    node it names. The composer shares an aliased node (the file stays small in memory); the count walks that graph
    once, iteratively, each node's expanded size computed from its children's."""
    sizes: Dict[int, int] = {}
    open_nodes = set()
    stack: List[Tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = min(1 + sum(sizes[id(child)] for child in _yaml_children(node)), 1 << 62)
            if sizes[key] > MAX_ALIAS_EXPANSION + len(sizes):
                raise AliasExpansionError(f"its aliases expand to more than {MAX_ALIAS_EXPANSION:,} values",
                                          node.start_mark)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise AliasExpansionError("an alias is used inside the value it names", node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _yaml_children(node) if id(child) not in sizes)


class StrictLoader(yaml.SafeLoader):
    """The safe loader (plain values only), refusing a mapping that repeats a key: ``lr: 0.05`` then ``lr: 5.0``
    is a mistake to name, not a value to pick. Keys brought in by a ``<<`` merge may still be overridden. Alias
    expansion is bounded (:func:`check_alias_expansion`): a small file never becomes a large value."""

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            check_alias_expansion(node)
        return node


def _construct_unique_mapping(loader: StrictLoader, node: yaml.MappingNode):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            repeated = key in seen
        except TypeError:  # an unhashable key: the safe loader's own error says so
            break
        if repeated:
            raise DuplicateKeyError(key, key_node.start_mark)
        seen.add(key)
    yield from loader.construct_yaml_map(node)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def strict_yaml_load(stream: Any) -> Any:
    """``yaml.safe_load`` that refuses a repeated key (:class:`DuplicateKeyError`) and an alias bomb
    (:class:`AliasExpansionError`); a document nested too deeply for the parser is a ``yaml.YAMLError`` too."""
    try:
        return yaml.load(stream, Loader=StrictLoader)
    except RecursionError:  # [[[[...]]]] thousands deep: the composer recurses once a level
        raise yaml.YAMLError("it is nested too deeply to read") from None


def load_yaml_config(path: str) -> Dict[str, Any]:
    """Read a YAML mapping of config keys (the run and sweep configs alike); one sentence on an unreadable, non-UTF-8
    or malformed file, an object tag, or a key given twice."""
    try:
        handle = open_regular(path, "config file")  # a FIFO or a device: refused before a byte is read
    except DataError as error:
        if not isinstance(error.__cause__, OSError):
            raise
        raise ConfigError(f"config file {path!r} cannot be read ({error.__cause__.strerror}); expected a readable "
                          "YAML file") from None
    try:
        with io.TextIOWrapper(handle, encoding="utf-8") as text:
            values = strict_yaml_load(text)
    except OSError as error:
        raise ConfigError(f"config file {path!r} cannot be read ({error.strerror}); expected a readable YAML file")
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path!r} is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                          f"{error.start}); expected a YAML file of config keys") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        if isinstance(error, DuplicateKeyError):
            raise ConfigError(f"config file {path!r} gives the key {error.key!r} twice{where}; expected each key "
                              "once") from None
        if isinstance(error, AliasExpansionError):
            raise ConfigError(f"config file {path!r} is refused: {error.problem}{where}; expected YAML whose "
                              "aliases (*name) repeat a few blocks of settings at most") from None
        if type(error) is yaml.YAMLError:  # strict_yaml_load's own: nested too deeply
            raise ConfigError(f"config file {path!r} cannot be read ({error}); expected a mapping of config keys") \
                from None
        tag = re.search(r"for the tag '([^']+)'", str(getattr(error, "problem", "")))
        if tag:  # the safe loader builds plain values only: an object tag is refused, never constructed
            raise ConfigError(f"config file {path!r} uses the tag {tag.group(1)!r}{where}, which is never loaded; "
                              "expected plain YAML values") from None
        raise ConfigError(f"config file {path!r} is not valid YAML{where}; expected a mapping of config keys") \
            from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path!r} holds a {type(values).__name__}; expected a mapping of config keys")
    out: Dict[str, Any] = {}
    spelled: Dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name in out:  # local-epochs and local_epochs: one key spelled twice
            raise ConfigError(f"config file {path!r} gives the key {name!r} twice (as {spelled[name]!r} and "
                              f"{key!r}); expected each key once")
        out[name], spelled[name] = value, key
    return out


#: The key of a sweep config's ``sweep:`` block (hasfl_ray.sweep) and the keys that block takes.
SWEEP_KEY = "sweep"
SWEEP_FIELDS = ("reproduces", "datasets", "algorithms", "seeds", "per_dataset", "variants", "out")


def split_sweep_config(values: Mapping[str, Any], source: str) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """(the ``sweep:`` block or None, the shared RunConfig keys) of a config file's mapping; one sentence when the
    block is malformed, or when a key that cannot apply is given (a seed, dataset or algorithm that the sweep's
    lists set for each cell, in another layer)."""
    shared = {k: v for k, v in values.items() if k != SWEEP_KEY}
    if SWEEP_KEY not in values:
        return None, shared
    block = values[SWEEP_KEY]
    if not isinstance(block, dict):
        raise ConfigError(f"{source} has a sweep block of type {type(block).__name__}; expected a mapping with keys "
                          + ", ".join(SWEEP_FIELDS))
    block = {str(k).replace("-", "_"): v for k, v in block.items()}
    unknown = sorted(set(block) - set(SWEEP_FIELDS))
    if unknown:
        raise ConfigError(f"{source} has unknown sweep key {unknown[0]!r}; expected one of {', '.join(SWEEP_FIELDS)}")
    for name in ("per_dataset", "variants"):
        mapping = block.get(name) or {}
        if not isinstance(mapping, dict) or not all(isinstance(v, dict) for v in mapping.values()):
            raise ConfigError(f"{source} has sweep.{name} {mapping!r}; expected a mapping of names to mappings of "
                              "config keys")
        block[name] = {str(k): {str(kk).replace("-", "_"): vv for kk, vv in v.items()} for k, v in mapping.items()}
    out = block.get("out")
    if out is not None and (not isinstance(out, str) or not out.strip()):
        raise ConfigError(f"{source} has sweep.out {_shown(out)}; expected a folder path such as runs/table3")
    # a key the sweep sets for each cell (sweep.datasets, seeds, algorithms) never reaches a cell from another
    # layer: refused by name, never dropped (a variant names its algorithm: that is what a variant is)
    for key in ("dataset", "seed", "algorithm"):
        for layer in ("per_dataset", "variants") if key != "algorithm" else ("per_dataset",):
            for name, keys in block[layer].items():
                if key in keys:
                    raise ConfigError(f"{source} has {key} {_shown(keys[key])} in sweep.{layer}.{name}, but the "
                                      f"sweep sets each cell's {key}; expected it in sweep.{key}s")
        if key in shared and block.get(key + "s") is not None:
            raise ConfigError(f"{source} has {key} {_shown(shared[key])} and sweep.{key}s "
                              f"{_shown(block[key + 's'])}, but sweep.{key}s names every cell's {key}; expected one "
                              "of them")
    return block, shared


def _shown(value: Any) -> str:
    """``repr(value)``, cut short when long (a sentence names the value, never pages of it)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


def sweep_list(value: Any, name: str, source: str) -> List[Any]:
    """A sweep block's ``datasets``/``algorithms``/``seeds`` entry as a list (empty when absent; one value as a
    list of one); one sentence when it is neither one value nor a non-empty list, or when an entry is not a name
    (``seeds``: not a non-negative integer)."""
    if value is None:
        return []
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{source} has sweep.{name} {_shown(value)}; expected a non-empty list")
    for item in value:  # names are strings, seeds integers: a mapping or list among them is one sentence
        if name == "seeds" and (not isinstance(item, int) or isinstance(item, bool) or item < 0):
            raise ConfigError(f"{source} has seed {_shown(item)} in sweep.seeds; expected non-negative integers "
                              "such as 42, 43, 44")
        if name != "seeds" and (not isinstance(item, str) or not item.strip()):
            raise ConfigError(f"{source} has {_shown(item)} in sweep.{name}; expected {name[:-1]} names such as "
                              + ("digits, emnist" if name == "datasets" else "hasfl, random-budget"))
    return value


def single_run_values(values: Mapping[str, Any], flags: Dict[str, Any], source: str) -> Dict[str, Any]:
    """The RunConfig keys ``simulate --config`` takes from a config file: a plain one as it is; a sweep config's
    shared keys, then the ``per_dataset`` keys of the dataset run (``--dataset``, else the sweep's first), then the
    keys of the variant ``--algorithm`` names, with the sweep's first algorithm and seed as defaults. An
    ``--algorithm`` flag naming a variant is replaced in ``flags`` by the algorithm the variant runs."""
    block, shared = split_sweep_config(values, source)
    if block is None:
        return shared
    datasets = sweep_list(block.get("datasets"), "datasets", source) or [shared.get("dataset", "digits")]
    algorithms = sweep_list(block.get("algorithms"), "algorithms", source) or [shared.get("algorithm", "hasfl")]
    seeds = sweep_list(block.get("seeds"), "seeds", source) or [shared.get("seed", 42)]
    dataset = flags.get("dataset") or datasets[0]
    algorithm = flags.get("algorithm") or algorithms[0]
    result = {**shared, "dataset": dataset, "seed": seeds[0],
              **block["per_dataset"].get(dataset, {})}
    variant = block["variants"].get(algorithm)
    result.update(variant if variant is not None else {"algorithm": algorithm})
    if variant is not None and flags.get("algorithm") == algorithm:
        flags["algorithm"] = result.get("algorithm", "hasfl")
    return result


#: Faults ``--fault-inject KIND@ROUND`` can inject: a killed Ray trainer; a client update poisoned with NaN/Inf
#: (the round's first participant; every backend), which the server must reject; an exception raised inside the
#: trainer of the round's first participant (every backend), which must end the run in one sentence.
FAULT_KINDS = ("kill-trainer", "nan-update", "inf-update", "trainer-error")


def parse_fault(spec: str) -> Optional[Tuple[str, int]]:
    """(kind, round) of a ``KIND@ROUND`` fault-injection spec, or None when it is malformed."""
    match = re.fullmatch(rf"({'|'.join(FAULT_KINDS)})@(\d+)", spec) if isinstance(spec, str) else None
    return (match.group(1), int(match.group(2))) if match else None


def fault_inject_round(spec: str) -> Optional[int]:
    """The round of a ``kill-trainer@ROUND`` fault-injection spec, or None for any other spec."""
    fault = parse_fault(spec)
    return fault[1] if fault is not None and fault[0] == "kill-trainer" else None


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_number = registry.finite_number


def _positive_number(value: Any) -> bool:
    return _number(value) and value > 0
