"""The run configuration's checks: every field's value on construction, one sentence naming the key, its value and
what was expected (:class:`~hasfl_ray.errors.ConfigError`); :class:`~hasfl_ray.config.schema.RunConfigFields` calls
:func:`check_fields` from ``__post_init__``. Normalising a value (e.g. ``eval_widths: full``) sets it on the frozen
instance."""

from __future__ import annotations

import re
from typing import Any, Mapping

from hasfl_ray import registry
from hasfl_ray.config.faults import FAULT_KINDS, parse_fault
from hasfl_ray.config.model_keys import MODEL_CHOICES, check_model_keys
from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import PAPER_WIDTHS, WIDTH_ASSIGNMENTS, global_width_of, normalise_ladder, normalise_partition

MAX_LR = registry.MAX_LR
#: Where the Ray backend's server may run (``server_placement``; hasfl_ray.simulation.placement.server_placement).
SERVER_PLACEMENTS = ("auto", "driver", "actor")
#: ``precision``'s values (hasfl_ray/training/precision.py).
PRECISIONS = ("fp32", "bf16")


def check_fields(self) -> None:
    """Check (and normalise) every field of a :class:`~hasfl_ray.config.schema.RunConfigFields` on construction:
    one :class:`~hasfl_ray.errors.ConfigError` sentence naming the key, its value and what was expected."""
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
    _check_evaluation(self, bad)
    for name in ("rounds", "local_epochs", "batch_size"):
        value = getattr(self, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise bad(name, value, "a positive integer")
    if self.clients_per_round > self.clients:
        raise ConfigError(f"clients_per_round is {self.clients_per_round} but clients is {self.clients}; "
                          "expected at most as many participants per round as clients")
    _check_ladder(self, bad)
    if self.estimator not in ("masked", "common-core"):
        raise bad("estimator", self.estimator, "masked or common-core")
    if self.classifier_aggregation not in ("all", "label_split"):
        raise bad("classifier_aggregation", self.classifier_aggregation, "all or label_split")
    if self.aggregation_weights not in ("samples", "count"):
        raise bad("aggregation_weights", self.aggregation_weights, "samples (n_i) or count (1 a client)")
    if not isinstance(self.warmup, int) or self.warmup < 0:
        raise bad("warmup", self.warmup, "a non-negative integer")
    if not _positive_number(self.alpha):
        raise bad("alpha", self.alpha, "a number > 0")
    if self.lr is not None and (not _positive_number(self.lr) or self.lr > MAX_LR):
        raise bad("lr", self.lr, f"a number > 0 and at most {MAX_LR:g} (a larger step overflows float32 weights)")
    for name, low, high in (("lr_decay", 0, 1), ("momentum", 0, 1)):
        value = getattr(self, name)
        if value is not None and (not _number(value) or not low <= value <= high):  # None: unset (resolved())
            raise bad(name, value, f"a number in [{low}, {high}]")
    milestones = self.lr_milestones
    if milestones is not None:
        if not isinstance(milestones, (list, tuple)) or not milestones or not all(
                isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in milestones) or \
                list(milestones) != sorted(set(milestones)):
            raise bad("lr_milestones", milestones, "increasing positive round numbers, e.g. [150, 250]")
        object.__setattr__(self, "lr_milestones", list(milestones))
    if not _number(self.lr_gamma) or not 0 < self.lr_gamma <= 1:
        raise bad("lr_gamma", self.lr_gamma, "a number in (0, 1] (the factor at each of lr_milestones)")
    hashes = self.input_sha256
    if hashes is not None and (not isinstance(hashes, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in hashes.items())):
        raise bad("input_sha256", hashes, "a mapping of input names to sha256 hex digests (written by hasfl-ray, "
                                          "not by hand)")
    if self.augmentation not in ("none", "crop_flip"):
        raise bad("augmentation", self.augmentation, "none or crop_flip (RandomCrop with padding 4 and a "
                                                     "horizontal flip of image batches)")
    if self.input_normalization not in ("split", "sources"):
        raise bad("input_normalization", self.input_normalization, "split (the training split's own per-channel mean "
                  "and std) or sources (the sub-model sources' CIFAR constants)")
    if self.input_normalization == "sources" and self.dataset not in ("cifar10", "cifar100"):
        raise bad("input_normalization", self.input_normalization, f"split with dataset {self.dataset!r} (sources "
                  "is the sub-model sources' CIFAR constants: datasets cifar10 and cifar100 only)")
    if self.local_steps is not None and (not isinstance(self.local_steps, int) or
                                         isinstance(self.local_steps, bool) or self.local_steps < 1):
        raise bad("local_steps", self.local_steps, "a positive number of local iterations (or unset: "
                                                   "local_epochs)")
    if not _number(self.weight_decay) or self.weight_decay < 0:
        raise bad("weight_decay", self.weight_decay, "a number >= 0")
    if self.clip_norm is not None and (not _number(self.clip_norm) or self.clip_norm < 0):
        raise bad("clip_norm", self.clip_norm, "a number >= 0 (0 disables clipping)")
    if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
        raise bad("seed", self.seed, "a non-negative integer")
    value = self.data_fingerprint
    if value is not None and (not isinstance(value, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, (int, str)) and not isinstance(v, bool))
            for k, v in value.items())):
        raise bad("data_fingerprint", value, "a mapping of train_size, test_size, labels_sha256 and partition_sha256 "
                                             "(written by hasfl-ray once the data are loaded)")
    if self.data_seed is not None and (not isinstance(self.data_seed, int) or isinstance(self.data_seed, bool) or
                                       self.data_seed < 0):
        raise bad("data_seed", self.data_seed, "a non-negative integer (or unset: the seed)")
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
    if self.precision not in PRECISIONS:
        raise bad("precision", self.precision, "fp32 or bf16 (fp16 is not offered: it needs loss scaling)")
    if self.masked_loss in ("on", "off") and isinstance(self.masked_loss, str):  # --masked-loss on|off
        object.__setattr__(self, "masked_loss", self.masked_loss == "on")
    if not isinstance(self.masked_loss, bool):
        raise bad("masked_loss", self.masked_loss, "true or false (on or off)")
    _check_model(self, bad)
    _check_execution(self, bad)
    _check_clock(self)
    from hasfl_ray.config.privacy import check_privacy

    check_privacy(self, bad)
    from hasfl_ray.config.asynchronous import ASYNC_KEYS, SYNC_ONLY, check_async_keys

    values = check_async_keys({k: getattr(self, k) for k in ("mode", "clients_per_round", *ASYNC_KEYS, *SYNC_ONLY)},
                              self.clients, self.devices, self.deadline)
    for name, value in values.items():
        object.__setattr__(self, name, value)
    from hasfl_ray.config.server_optimizer import SERVER_KEYS, check_server_keys

    _check_participation(self, bad)
    for name, value in check_server_keys({k: getattr(self, k) for k in SERVER_KEYS}, self.mode,
                                         self.async_rule).items():
        object.__setattr__(self, name, value)
    if self.local_optimizer != "sgd" or self.local_optimizer_options:  # (torch is imported for another optimiser only)
        from hasfl_ray.config.local_optimizer import check_local_optimizer

        name, options = check_local_optimizer(self.local_optimizer, self.local_optimizer_options)
        object.__setattr__(self, "local_optimizer", name)
        object.__setattr__(self, "local_optimizer_options", options)


def _check_participation(self, bad) -> None:
    """participation: fixed or poisson, the latter only where the engine draws synchronous rounds itself."""
    if self.participation not in ("fixed", "poisson"):
        raise bad("participation", self.participation, "fixed (clients_per_round of the clients each round) or poisson "
                                                       "(each client independently with probability clients_per_round "
                                                       "/ clients)")
    if self.participation == "poisson" and (self.mode == "async" or self.devices is not None):
        why = ("mode is 'async', whose server draws no rounds" if self.mode == "async" else
               "devices is set (a device population), whose clock invites each round's clients")
        raise ConfigError(f"participation is 'poisson' but {why}; expected participation fixed there")


def _check_model(self, bad) -> None:
    """Validate model, model_norm, model_scaler and the sBN keys (:func:`check_model_keys`)."""
    check_model_keys(self, bad)


def _check_ladder(self, bad) -> None:
    """Validate (and normalise) widths, width_mix, tier_counts, width_assignment and partition."""
    # global_width first: the rate of width_mix's first level, read before the notation is normalised away
    object.__setattr__(self, "global_width", global_width_of(self.global_width, self.widths, self.width_mix))
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
                                             + tier_counts_example(self.clients, len(tiers), widths is None))
        if mix is not None:
            raise ConfigError(f"tier_counts is {list(counts)!r} and width_mix is {self.width_mix!r}; expected one "
                              "of them (tier_counts: exact client counts per width; width_mix: shares)")
        object.__setattr__(self, "tier_counts", [int(n) for n in counts])
    if self.width_assignment not in WIDTH_ASSIGNMENTS:
        raise bad("width_assignment", self.width_assignment, "fixed (a client's p^max drawn once for the run) or "
                                                             "dynamic (redrawn from the mix every round)")
    object.__setattr__(self, "partition", normalise_partition(self.partition))
    if self.global_width < 1 and self.model not in MODEL_CHOICES:
        raise ConfigError(f"global_width is {self.global_width!r} but model is "
                          f"{'unset' if self.model is None else repr(self.model)}; expected a narrower global "
                          f"model only with model {', '.join(MODEL_CHOICES)} (its stages are scaled)")


def tier_counts_example(clients: Any, tiers: int, paper: bool) -> str:
    """An example of valid ``tier_counts`` on the paper's ladder (``paper``; none for given widths) for this run's
    ``clients`` (so never the refused value, which is not valid): the paper's own runs' [4, 10, 3, 3] for 20
    clients, else ``clients`` split evenly over the tiers."""
    if not paper or not isinstance(clients, int) or isinstance(clients, bool) or clients < 0:
        return ""
    if clients == 20 and tiers == 4:
        return ", e.g. [4, 10, 3, 3] (the paper's runs)"
    even = [clients // tiers + (1 if i < clients % tiers else 0) for i in range(tiers)]
    return f", e.g. {even}"


def _check_evaluation(self, bad) -> None:
    """Validate (and normalise) eval_widths, eval_every, local_eval_every and local_eval_width."""
    widths = self.eval_widths
    if isinstance(widths, str) and widths.strip() == "full":  # the full model only: a flag's or YAML's word
        widths = [1.0]
    if widths is not None:
        if not isinstance(widths, (list, tuple)) or not widths or not all(
                _number(w) and not isinstance(w, bool) and 0 < w <= 1 for w in widths):
            raise bad("eval_widths", widths, "a list of widths in (0, 1], e.g. [0.25, 0.5, 1.0] (1.0 is always "
                                             "evaluated), or full")
        object.__setattr__(self, "eval_widths", sorted({float(w) for w in widths} | {1.0}))
    value = self.eval_every
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise bad("eval_every", value, "a positive integer (rounds between evaluations at each width)")
    value = self.test_every
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise bad("test_every", value, "a positive integer (rounds between test-accuracy evaluations)")
    if not isinstance(self.test_first, bool):
        raise bad("test_first", self.test_first, "true or false (also evaluate the first round)")
    value = self.test_last
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad("test_last", value, "a non-negative integer (the last rounds that are each evaluated; 0: the last "
                                      "one only)")
    value = self.test_phase
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise bad("test_phase", value, "a positive integer (a 1-based round the evaluation cadences pass "
                                       "through) or unset")
    value = self.local_eval_every
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise bad("local_eval_every", value, "a non-negative integer (rounds between local-accuracy evaluations; "
                                             "0: after the last round only)")
    if self.local_eval_width not in ("final", "p_max"):
        raise bad("local_eval_width", self.local_eval_width, "final or p_max")
    if self.local_eval_rule not in ("labels", "source"):
        raise bad("local_eval_rule", self.local_eval_rule, "labels (the client's labels' test samples at its own "
                                                           "width) or source (HeteroFL's and FedRolex's rule: "
                                                           "its own test shard, the global model)")
    value = self.local_eval_clients
    if not (value in ("all", "off") or (isinstance(value, int) and not isinstance(value, bool) and value > 0)):
        raise bad("local_eval_clients", value, "a positive number of clients (exact up to it, a seeded sample "
                                               "of it beyond), all or off")
    if value == "off" and self.local_eval_every:
        raise ConfigError(f"local_eval_every is {self.local_eval_every} but local_eval_clients is 'off'; expected "
                          "local_eval_every 0, or local_eval_clients N or all")


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
    for name in ("deterministic", "handoff"):
        if not isinstance(getattr(self, name), bool) and (name == "deterministic" or self.handoff is not None):
            raise bad(name, getattr(self, name), "true or false")
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
    if self.server_placement is not None and self.server_placement not in SERVER_PLACEMENTS:
        raise bad("server_placement", self.server_placement, "auto, driver or actor")
    for name in ("actors", "gpus_per_actor", "address", "server_placement"):
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


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_number = registry.finite_number


def _positive_number(value: Any) -> bool:
    return _number(value) and value > 0
