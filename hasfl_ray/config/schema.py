"""The run configuration's fields and their checks: the frozen dataclass that RunConfig extends."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from hasfl_ray import registry
from hasfl_ray.config.faults import FAULT_KINDS, parse_fault
from hasfl_ray.config.model_keys import MODEL_CHOICES, MODEL_NORMS, check_model_keys
from hasfl_ray.errors import ConfigError
from hasfl_ray.evaluation import LOCAL_EVAL_CLIENTS
from hasfl_ray.federation import (PAPER_WIDTHS, WIDTH_ASSIGNMENTS, global_width_of, normalise_ladder,
                                  normalise_partition)


#: FLOAT32_MAX and MAX_LR: the bounds of every real-valued key and option (hasfl_ray.registry, shared with the
#: algorithms' options).
FLOAT32_MAX, MAX_LR = registry.FLOAT32_MAX, registry.MAX_LR


@dataclass(frozen=True)
class RunConfigFields:
    """The run configuration's fields and the checks each value passes on construction (one sentence,
    :class:`~hasfl_ray.errors.ConfigError`, naming the key); :class:`~hasfl_ray.config.runconfig.RunConfig` adds
    resolution and (de)serialisation. The options routing and the migration read field names and defaults here."""

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
    # ResNet-18) or resnet18 (FjORD's), on an image dataset, with model_norm sbn (default), bn, gn or none, model_scaler
    # on (default) or off; sub_model width (default), depth or width_depth (docs/models.md#depth-sub-models: the model
    # with exits, a client of ladder width p trains depth depths[p]; depths None: ceil(p x its stages))
    model: Optional[str] = None
    model_norm: Optional[str] = None
    model_scaler: Optional[str] = None
    sub_model: str = "width"
    depths: Optional[List[int]] = None
    # the global model's width g (HeteroFL's global_model_rate; hasfl_ray/federation.py): a number in (0, 1] or first
    # (the first level of width_mix's notation: row b1-e1 trains a width-1/2 network); the ResNet's stages are
    # ceil(g * c) channels and a client of ladder width r trains its width-r/g slice
    global_width: Any = 1.0  # first becomes the number on validation
    # sBN's evaluation statistics (docs/models.md): shuffled (HeteroFL's pass: a seeded permutation of all clients'
    # training samples in batches of sbn_batch_size), in_order (client after client in eval_batch_size batches) or
    # test_batch (FedRolex, FIARSE: no pass, each test batch normalised with its own statistics); the shuffled pass
    # reads the clients' samples as loaded, or (training_set) HeteroFL's whole training set through the augmentation
    sbn_statistics: str = "shuffled"
    sbn_batch_size: int = 10
    sbn_statistics_data: str = "clients"
    # FedProx's Synthetic(alpha, beta) data (--dataset synthetic): labeller and input heterogeneity
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    # local optimisation
    local_epochs: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    lr_decay: float = 0.995
    # a step schedule besides the decay: lr x lr_gamma at each of these rounds (HeteroFL's and FedRolex's MultiStepLR)
    lr_milestones: Optional[List[int]] = None
    lr_gamma: float = 0.1
    # a fixed number of local iterations (batches) instead of local_epochs (FIARSE: 100); None: local_epochs
    local_steps: Optional[int] = None
    # training augmentation of image batches: none, or crop_flip (RandomCrop(padding 4) and a horizontal flip, as the
    # sub-model sources train CIFAR-10; seeded by seed, round, client and step)
    augmentation: str = "none"
    # the sha256 of every file the run reads beside its config (a device trace, a plug-in's FILE.py), set by RunConfig
    # .resolved (hasfl_ray/config/inputs.py): --resume and a sweep's reuse compare it
    input_sha256: Optional[Dict[str, str]] = None
    momentum: Optional[float] = None
    weight_decay: float = 1e-4
    clip_norm: Optional[float] = None
    # masked cross-entropy (HeteroFL's and FedRolex's mask 1): the logits of the labels a client does not hold set to
    # 0 in its training loss, for every algorithm and training path (on/off read as true/false)
    masked_loss: bool = False
    eval_batch_size: int = 500
    # evaluate on a seeded subset of this many test samples, the same every round (None or 0: the whole test set)
    eval_samples: Optional[int] = None
    # the global model cut to each of these widths is evaluated too (None: the distinct p^max of the run's tiers and
    # 1.0; [1.0]: the full model only), every eval_every rounds (None: the dataset's default, 1 on digits and
    # synthetic, else 5) and after the last; each client's local accuracy after the last round and every
    # local_eval_every rounds (0: the last only), at its final p or its p^max (local_eval_width), by the rule
    # local_eval_rule: labels (its labels' test samples, own width, logits off its labels at -inf, mean over
    # clients) or source (HeteroFL's and FedRolex's: its own test shard, the global model, logits off its label
    # split set to 0, mean weighted by samples)
    eval_widths: Optional[List[float]] = None
    eval_every: Optional[int] = None
    local_eval_every: int = 0
    local_eval_width: str = "final"
    local_eval_rule: str = "labels"
    # which clients the local-accuracy pass scores: every client up to this many (an int), a seeded sample of this
    # many beyond it (summary.json says so), all (every client, however many) or off (no local-accuracy pass)
    local_eval_clients: Any = LOCAL_EVAL_CLIENTS
    # the adaptation schedule (HAS-FL's and random-budget's; the engine's post-warm-up avg_p and coverage monitor
    # count from it): warm-up rounds at p^max, then an adaptation at every t >= warmup with t % t_adapt == 0
    t_adapt: int = 5
    warmup: int = 10
    # divergence estimator Ĥ_i: masked (client i's own coordinates, the paper's Eq. 5) or common-core (only the
    # coordinates every participant of the round covers; Section 4's second variant)
    estimator: str = "masked"
    # the output layer's rows: all (over every covering client) or label_split (row k over the round's clients holding
    # label k, HeteroFL's and FedRolex's combine; hasfl_ray/aggregation/label_split.py)
    classifier_aggregation: str = "all"
    # the weight of each client's update in the coordinate-wise mean: samples (n_i, the default) or count (1 a
    # client: HeteroFL's and FedRolex's combine; FedBuff's equal-weight (1/K) form in an asynchronous run)
    aggregation_weights: str = "samples"
    # execution (does not change results); auto: default_backend(), the one rule of the CLI and the Python API
    backend: str = "auto"
    aggregation_backend: str = "auto"
    trainer_threads: int = 1
    device: str = "auto"
    # local training of the clients of one width as one batched computation (auto = off: auto_training_modes; mixed:
    # of every width, padded to the widest); agrees with one-at-a-time training to float tolerance (--resume compares)
    client_batching: str = "auto"
    # a whole local step captured once as a CUDA graph and replayed, for the clients trained one at a time whose
    # objective allows it (auto = on for CUDA, off on CPU, where on runs the same static-buffer step eagerly, with
    # identical results); compared by --resume (a run written before it existed trained eagerly: off)
    cuda_graphs: str = "auto"
    # bit-identical CUDA runs (deterministic cuBLAS/cuDNN, no autotuning); False = --fast-nondeterministic
    deterministic: bool = True
    # a Ray run that starts Ray here trains its first rounds in this process while Ray starts (docs/ray.md, 'Start-up');
    # None: yes when backend auto chose Ray, no when backend ray is given (resolved() decides)
    handoff: Optional[bool] = None
    # Ray backend, checkpoints and fault injection (never change results; not compared by --resume)
    actors: Optional[int] = None
    gpus_per_actor: Optional[float] = None
    address: Optional[str] = None
    checkpoint_every: int = 10
    fault_inject: Optional[str] = None
    control_variates_dir: Optional[str] = None
    # the device clock (docs/clock.md; off while devices is None): the device population (a trace PATH.csv, lognormal
    # or pareto, or a mapping with trace, tiers or distribution), the availability model (None: the trace's intervals
    # where it gives them, else always; always, trace or markov:ON,OFF), the deadline in simulated seconds and what
    # becomes of a late update (drop, partial or overselect with fraction F), the chance a client drops out mid-round
    devices: Optional[Any] = None
    availability: Optional[str] = None
    deadline: Optional[float] = None
    deadline_policy: str = "drop"
    overselect: Optional[float] = None
    dropout: float = 0.0
    # the asynchronous run mode (docs/async.md; sync: rounds, the default, every key below unset): C clients in
    # flight, FedBuff (K buffered updates) or FedAsync (each arrival mixed in with alpha), the staleness function,
    # evaluation every N server updates or S simulated seconds (hasfl_ray.config.asynchronous)
    mode: str = "sync"
    concurrency: Optional[int] = None
    async_rule: Optional[str] = None
    buffer_size: Optional[int] = None
    staleness: Optional[str] = None
    async_alpha: Optional[float] = None
    # FedBuff's server step (eta_g, momentum beta) and FedAsync's local proximal weight rho (config/asynchronous.py)
    server_lr: Optional[float] = None
    server_momentum: Optional[float] = None
    async_rho: Optional[float] = None
    eval_every_updates: Optional[int] = None
    eval_every_seconds: Optional[float] = None

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
            if (value is not None or name != "momentum") and (not _number(value) or not low <= value <= high):
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
        if self.masked_loss in ("on", "off") and isinstance(self.masked_loss, str):  # --masked-loss on|off
            object.__setattr__(self, "masked_loss", self.masked_loss == "on")
        if not isinstance(self.masked_loss, bool):
            raise bad("masked_loss", self.masked_loss, "true or false (on or off)")
        self._check_model(bad)
        self._check_execution(bad)
        self._check_clock()
        from hasfl_ray.config.asynchronous import ASYNC_KEYS, SYNC_ONLY, check_async_keys

        values = check_async_keys({k: getattr(self, k) for k in ("mode", "clients_per_round", *ASYNC_KEYS, *SYNC_ONLY)},
                                  self.clients, self.devices, self.deadline)
        for name, value in values.items():
            object.__setattr__(self, name, value)

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
                                                 + (", e.g. [4, 10, 3, 3] for 20" if widths is None else ""))
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


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_number = registry.finite_number


def _positive_number(value: Any) -> bool:
    return _number(value) and value > 0
