"""The run configuration's fields: the frozen dataclass that RunConfig extends (their checks: :mod:`hasfl_ray.config.checks`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hasfl_ray import registry
from hasfl_ray.config.model_keys import MODEL_CHOICES, MODEL_NORMS  # noqa: F401 (re-exported)
from hasfl_ray.evaluation import LOCAL_EVAL_CLIENTS


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
    # how each round's participants are drawn (docs/privacy.md, "Poisson participation"): fixed (clients_per_round of
    # the clients uniformly without replacement) or poisson (each client independently with probability
    # clients_per_round / clients, so a round may have more, fewer or none)
    participation: str = "fixed"
    seed: int = 42
    # the seed of the federation: the partition, the capacity tiers (and dynamic redraws), the device population;
    # seed keeps initialisation, sampling and training. None: the seed (RunConfig.effective_data_seed), so every
    # run keeps the hashes of before the key existed
    data_seed: Optional[int] = None
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
    # on (default) or off; sub_model width (None: width, or what the algorithm sets: depthfl depth, scalefl
    # width_depth), depth or width_depth (docs/models.md#depth-sub-models: the model with exits, a client of ladder
    # width p trains depth depths[p]; depths None: ceil(p x its stages))
    model: Optional[str] = None
    model_norm: Optional[str] = None
    model_scaler: Optional[str] = None
    sub_model: Optional[str] = None
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
    # None: 0.995 (RunConfig.resolved: DEFAULT_LR_DECAY), or what the algorithm sets (depthfl: depthfl_lr_decay); a
    # value given, 0.995 included, is never replaced
    lr_decay: Optional[float] = None
    # a step schedule besides the decay: lr x lr_gamma at each of these rounds (HeteroFL's and FedRolex's MultiStepLR)
    lr_milestones: Optional[List[int]] = None
    lr_gamma: float = 0.1
    # a fixed number of local iterations (batches) instead of local_epochs (FIARSE: 100); None: local_epochs
    local_steps: Optional[int] = None
    # training augmentation of image batches: none, or crop_flip (RandomCrop(padding 4) and a horizontal flip, as the
    # sub-model sources train CIFAR-10; seeded by seed, round, client and step)
    augmentation: str = "none"
    # how cifar10 / cifar100 image batches are standardised: split (the loaded training split's exact per-channel mean
    # and std) or sources (the constants the sub-model sources' data code normalises CIFAR with: data/images.py's
    # SOURCE_NORMALIZATION)
    input_normalization: str = "split"
    # the sha256 of every file the run reads beside its config (a device trace, a plug-in's FILE.py), set by RunConfig
    # .resolved (hasfl_ray/config/inputs.py): --resume and a sweep's reuse compare it
    input_sha256: Optional[Dict[str, str]] = None
    # the data the run trained on, by their content (train_size, test_size, labels_sha256, partition_sha256), set by
    # the engine once the dataset is loaded (hasfl_ray/data/fingerprint.py): compared as input_sha256 is
    data_fingerprint: Optional[Dict[str, Any]] = None
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
    # test_accuracy (the full-width evaluation, and its sBN statistics pass) every test_every rounds and after the
    # last; the other rounds' lines hold null (default 1: every round); accuracy_at_width on rounds that are both;
    # test_first and test_last add the first round and each of the last test_last rounds to both cadences (FIARSE's
    # server.py: every save_freq rounds, the first and the last 100); test_phase, a 1-based round both cadences
    # pass through, rounds t with t % K == test_phase % K (None: rounds K, 2K, ...; the paper's figures: 5 and 1)
    test_every: int = 1
    test_first: bool = False
    test_last: int = 0
    test_phase: Optional[int] = None
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
    # the arithmetic of local training's forward and loss: fp32 (the default; every result before the key existed) or
    # bf16 (torch.autocast to bfloat16 around them; fp32 weights, gradients, optimiser step and evaluation;
    # hasfl_ray/training/precision.py); changes results, so --resume compares it
    precision: str = "fp32"
    # bit-identical CUDA runs (deterministic cuBLAS/cuDNN, no autotuning); False = --fast-nondeterministic
    deterministic: bool = True
    # a Ray run that starts Ray here trains its first rounds in this process while Ray starts (docs/ray.md, 'Start-up');
    # None: yes when backend auto chose Ray, no when backend ray is given (resolved() decides)
    handoff: Optional[bool] = None
    # Ray backend, checkpoints and fault injection (never change results; not compared by --resume)
    actors: Optional[int] = None
    gpus_per_actor: Optional[float] = None
    address: Optional[str] = None
    # where the Ray backend's server (global model, aggregation) runs: driver (in this process, no hop through a
    # server actor), actor (its own actor, as on a GPU or a remote cluster), None/auto: placement.server_placement
    server_placement: Optional[str] = None
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
    # FedBuff's server step (eta_g, momentum beta), in either mode the server optimiser's (below), and FedAsync's local
    # proximal weight rho (config/asynchronous.py)
    server_lr: Optional[float] = None
    server_momentum: Optional[float] = None
    async_rho: Optional[float] = None
    eval_every_updates: Optional[int] = None
    eval_every_seconds: Optional[float] = None
    # the server optimiser on the aggregated update, both modes (config/server_optimizer.py,
    # aggregation/server_optim.py): sgd (w + eta Delta), fedavgm (heavy ball, beta server_momentum), fedadam, fedyogi or fedadagrad (Reddi et al.,
    # 2021: eta server_lr, server_beta1, server_beta2, server_tau); FedBuff fills server_lr 1 and server_momentum 0
    server_optimizer: str = "sgd"
    server_beta1: Optional[float] = None
    server_beta2: Optional[float] = None
    server_tau: Optional[float] = None
    # the clients' local optimiser: sgd (the built-in step, every batched path) or any torch.optim class by name, with
    # its keyword options (training/local_optim.py)
    local_optimizer: str = "sgd"
    local_optimizer_options: Dict[str, Any] = field(default_factory=dict)
    # client-level differential privacy (docs/privacy.md, hasfl_ray/config/privacy.py; all unset: off): the noise
    # multiplier z, the clip C (default 1), the adaptive-clipping quantile, delta (default clients^-1.1), the target
    # epsilon the run stops before exceeding, and the accountant (rdp, default, or pld)
    dp_noise_multiplier: Optional[float] = None
    dp_clip: Optional[float] = None
    dp_adaptive_quantile: Optional[float] = None
    dp_delta: Optional[float] = None
    dp_epsilon: Optional[float] = None
    dp_accountant: Optional[str] = None

    def __post_init__(self) -> None:
        from hasfl_ray.config.checks import check_fields

        check_fields(self)

def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_number = registry.finite_number


def _positive_number(value: Any) -> bool:
    return _number(value) and value > 0
