"""The options `simulate` and `sweep` share: every RunConfig key a run takes from the command line, declared once and
applied to both commands by :func:`run_options`, and what the shared switches and ``--backend`` turn into."""

from __future__ import annotations

from typing import Any, Callable, Dict

import click

from hasfl_ray.errors import ConfigError
from hasfl_ray.simulation import require_ray

#: ``--partition``'s help, simulate's, sweep's and ``data inspect``'s (every scheme of
#: hasfl_ray.federation.PARTITION_SCHEMES; tests/cli/test_bad_input_battery5.py checks that none is missing).
PARTITION_HELP = ("Label partition of the image sets: dirichlet ({default}--alpha), balanced-dirichlet (FIARSE's: "
                  "Dirichlet(--alpha) proportions, equal client sizes), iid, classes:K (K classes per client, "
                  "HeteroFL's non-IID-K with each client's own test shard, e.g. classes:2), classes-even:K (exactly K "
                  "classes per client, each class split evenly over its holders) or shards:S (S label-sorted shards "
                  "per client, McMahan et al.'s, e.g. shards:2), or Flower Datasets' partitioners flwr:iid, "
                  "flwr:dirichlet:ALPHA, flwr:pathological:K, flwr:shard:S, flwr:natural_id:COLUMN; docs/datasets.md")

#: Where a command's own options go among the shared ones (:func:`run_options`): after --checkpoint-every, where
#: simulate's --resume always stood in its --help.
_OWN = object()

#: The shared options, in --help order.
RUN_OPTIONS = (
    click.option("--dataset", help="digits (embedded, default), emnist, cifar10, cifar100, shakespeare, synthetic, "
                                   "hf:PATH_OR_NAME[?image=COL&label=COL] (a Hugging Face image dataset, extra hub: "
                                   "docs/datasets.md#hub), or a plug-in: FILE.py:Class or MODULE:Class "
                                   "(docs/plugins.md)."),
    click.option("--data-dir", type=click.Path(), help="Where the dataset lives (a torchvision root for images)."),
    click.option("--download", is_flag=True, default=None, help="Download the dataset if it is missing."),
    click.option("--algorithm", help="hasfl (default), heterofl, fjord, uniform, random-budget, fedavg, fedprox, "
                                     "scaffold, fedrolex, fluid, depthfl, scalefl, fiarse or fedgmr (docs/algorithms.md), "
                                     "or a plug-in: "
                                     "FILE.py:Class "
                                     "or MODULE:Class subclassing hasfl_ray.Algorithm."),
    click.option("--algo-opt", multiple=True, metavar="KEY=VALUE",
                 help="An option of the algorithm (its options dataclass, built-in or plug-in); repeat for several. "
                      "Overrides the YAML's algorithm_options mapping."),
    click.option("--rounds", type=int, help="Communication rounds T (default: the dataset's protocol)."),
    click.option("--clients", type=int, help="Number of clients N (default 20)."),
    click.option("--clients-per-round", type=int, help="Participants sampled per round (default 10)."),
    click.option("--participation", type=click.Choice(["fixed", "poisson"]),
                 help="fixed (default): --clients-per-round clients drawn without replacement each round; poisson: "
                      "each client joins a round independently with probability clients-per-round / clients (a "
                      "round may have none), the sampling DP-FedAvg's and Opacus's accounting assume "
                      "(docs/privacy.md)."),
    click.option("--seed", type=int,
                 help="Seed of initialisation, sampling and training, and of the data unless --data-seed is given "
                      "(default 42)."),
    click.option("--data-seed", type=int,
                 help="Seed of the federation: the partition, the capacity tiers and the device population "
                      "(default: --seed), so the data can stay fixed while --seed varies."),
    click.option("--alpha", type=float, help="Dirichlet label-skew concentration (default 0.3)."),
    click.option("--partition", metavar="SCHEME", help=PARTITION_HELP.format(default="default; ") + "."),
    click.option("--synthetic-alpha", type=float, help="Synthetic(alpha, beta): labeller heterogeneity (default 1)."),
    click.option("--synthetic-beta", type=float, help="Synthetic(alpha, beta): input heterogeneity (default 1)."),
    click.option("--model", metavar="preresnet18|preresnet18-1112|resnet18|FILE.py:Class|MODULE:Class",
                 help="Train this network instead of the dataset's own: preresnet18 (HeteroFL's pre-activation "
                      "ResNet-18), preresnet18-1112 (the (1, 1, 1, 2) network of HeteroFL's published table) or "
                      "resnet18 (FjORD's), on image datasets of 1 or 3 channels (docs/models.md); or "
                      "a plug-in model, any nn.Module taking a width argument, its slicing derived "
                      "(docs/plugins.md#models)."),
    click.option("--model-norm", type=click.Choice(["sbn", "bn", "gn", "none"]),
                 help="--model's normalisation: sbn (static BatchNorm, default; evaluation statistics from a pass "
                      "over the clients' training data), bn (batch statistics), gn (GroupNorm) or none."),
    click.option("--sbn-statistics", type=click.Choice(["shuffled", "in-order", "test-batch"]),
                 help="sBN's evaluation statistics: shuffled (default; HeteroFL's pass over a seeded permutation of "
                      "all clients' training samples in --sbn-batch-size batches), in-order (client after client in "
                      "--eval-batch-size batches, the earlier pass) or test-batch (FedRolex's and FIARSE's: no pass, "
                      "each test batch's own statistics)."),
    click.option("--sbn-batch-size", type=int, help="Samples per batch of the sBN statistics pass (default 10, "
                                                     "HeteroFL's training batch)."),
    click.option("--sbn-statistics-data", type=click.Choice(["clients", "training-set"]),
                 help="What the shuffled sBN pass reads: clients (default; the clients' training samples as loaded) "
                      "or training-set (HeteroFL's stats: the whole training set, held by a client or not, through "
                      "--augmentation)."),
    click.option("--model-scaler", type=click.Choice(["on", "off"]),
                 help="--model's Scaler (HeteroFL's: activations divided by the width p in training): on (default) "
                      "or off."),
    click.option("--sub-model", type=click.Choice(["width", "depth", "width_depth"]),
                 help="The sub-model a client trains: width (default: the width-p slice of the whole network), depth "
                      "(the model with exits, its first stages and their exits at full width: DepthFL's) or "
                      "width_depth (both, as ScaleFL scales them); docs/models.md#depth-sub-models."),
    click.option("--depths", metavar="D1,D2,...",
                 help="With --sub-model depth or width_depth: the depth of each ladder width, in --widths order "
                      "(default: ceil(p x the model's stages), 1,2,3,4 for a ResNet on the paper's tiers)."),
    click.option("--global-width", metavar="G|first",
                 help="The global model's width (HeteroFL's global model rate): a number in (0, 1] (default 1) or "
                      "first (the first level of --width-mix, e.g. 0.5 for b1-e1); --model's stages are scaled to "
                      "it and a client of ladder width r trains its r/G slice (docs/models.md)."),
    click.option("--local-epochs", type=int, help="Local epochs K (default: the dataset's protocol)."),
    click.option("--batch-size", type=int, help="Local batch size (default 32)."),
    click.option("--lr", type=float, help="Initial local learning rate, decayed x0.995 per round."),
    click.option("--lr-decay", type=float, help="The learning rate's factor a round (default 0.995; 1: constant)."),
    click.option("--lr-milestones", metavar="R1,R2,...", help="A step schedule: the learning rate times --lr-gamma "
                                                               "at each of these rounds (HeteroFL: 150,250)."),
    click.option("--lr-gamma", type=float, help="The factor at each of --lr-milestones (default 0.1)."),
    click.option("--local-steps", type=int, help="A fixed number of local iterations (batches) a client trains, "
                                                 "in place of --local-epochs (FIARSE: 100)."),
    click.option("--weight-decay", type=float, help="Local SGD weight decay (default 1e-4)."),
    click.option("--augmentation", type=click.Choice(["none", "crop-flip"]),
                 help="Training augmentation of image batches: none (default) or crop-flip (RandomCrop with padding 4 "
                      "and a horizontal flip, as the sub-model sources train CIFAR-10)."),
    click.option("--input-normalization", type=click.Choice(["split", "sources"]),
                 help="How cifar10/cifar100 batches are standardised: split (default: the training split's own mean "
                      "and std) or sources (the constants HeteroFL, FedRolex, FjORD and FIARSE use, std "
                      "0.2023/0.1994/0.2010)."),
    click.option("--momentum", type=float, help="Local SGD momentum (default 0.9; 0 for scaffold)."),
    click.option("--local-optimizer", metavar="NAME",
                 help="The clients' optimiser: sgd (default: the built-in step, every batched path) or any torch.optim "
                      "class by name (adam, AdamW, RMSprop, ...; those clients train one at a time)."),
    click.option("--local-optimizer-options", metavar="JSON",
                 help="Its keyword options as a JSON object, e.g. '{\"betas\": [0.9, 0.99]}' (lr is --lr's; "
                      "weight_decay defaults to --weight-decay)."),
    click.option("--masked-loss", metavar="[on|off]",
                 help="Masked cross-entropy in local training (HeteroFL's and FedRolex's mask 1): the logits of the "
                      "labels a client does not hold in its training data set to 0 in its loss, for every algorithm: "
                      "on or off (default)."),
    click.option("--p-min", type=float, help="HAS-FL base capacity p_min (default 0.4)."),
    click.option("--gamma", type=float, help="HAS-FL sensitivity gamma (default 0.25)."),
    click.option("--beta", type=float, help="HAS-FL EMA factor beta (default 0.9)."),
    click.option("--t-adapt", type=int, help="HAS-FL adaptation interval (default 5)."),
    click.option("--warmup", type=int, help="HAS-FL warm-up rounds (default 10)."),
    click.option("--t-norm", type=int, help="HAS-FL normalisation interval (default 20)."),
    click.option("--classifier-aggregation", type=click.Choice(["all", "label_split"]),
                 help="The output layer's rows: all (default; the mean over every client covering them) or "
                      "label_split (row k over only the round's clients holding label k, HeteroFL's and FedRolex's "
                      "combine; rows no one holds keep their value)."),
    click.option("--aggregation-weights", type=click.Choice(["samples", "count"]),
                 help="Each client's weight in the coordinate-wise mean, for every algorithm: samples (default; "
                      "n_i) or count (1 a client: HeteroFL's and FedRolex's combine, and FedBuff's equal-weight "
                      "(1/K) form in --mode async)."),
    click.option("--estimator", type=click.Choice(["masked", "common-core"]),
                 help="HAS-FL divergence estimator: masked (default; each client's own coordinates) or common-core "
                      "(only the coordinates every participant of the round covers)."),
    click.option("--tier-counts", metavar="N1,N2,N3,N4",
                 help="Clients per capacity tier p^max 0.25,0.5,0.75,1.0 (default: the text's 8,5,4,3 of 20; "
                      "4,10,3,3 is the mix of the paper's own runs); with --widths, one count per width."),
    click.option("--widths", metavar="W1,W2,...",
                 help="The width ladder clients' capacities p^max come from: widths in (0, 1], e.g. "
                      "1,0.5,0.25,0.125,0.0625 (default: the paper's tiers 0.25,0.5,0.75,1); docs/configs.md."),
    click.option("--width-mix", metavar="MIX",
                 help="Each width's share of the clients, e.g. 1,1,1,1,1 (default: equal; the paper's 40:25:20:15 for "
                      "its tiers), or HeteroFL's notation a1-b1-c1-d1-e1 (levels a-e = widths 1, 1/2, 1/4, 1/8, "
                      "1/16, each followed by its share), which names the widths too."),
    click.option("--width-assignment", type=click.Choice(["fixed", "dynamic"]),
                 help="fixed (default): a client's p^max is dealt once for the run; dynamic: redrawn from the mix "
                      "every round (HeteroFL's dynamic; its own seeded stream)."),
    click.option("--no-coverage", is_flag=True, default=False,
                 help="Disable the coverage guarantee of hasfl and random-budget (ablation)."),
    click.option("--mu", type=float, help="FedProx proximal weight mu (default 1.0)."),
    click.option("--budget", type=float, help="random-budget's target average width after warm-up (default: HAS-FL's "
                                             "allocation under equal estimates, 0.505 for 20 clients)."),
    click.option("--budget-from", type=click.Path(), help="random-budget: take the target from RUN/summary.json's "
                                                          "avg_p_post_warmup (e.g. a HAS-FL run directory, "
                                                          "same seed)."),
    click.option("--heterofl-weighting", type=click.Choice(["samples", "count"]),
                 help="heterofl aggregation weights: samples n_i (default, the paper's) or count "
                      "(HeteroFL's original)."),
    click.option("--fjord-distill-weight", type=float, help="FjORD self-distillation weight (default 1.0)."),
    click.option("--scaffold-global-lr", type=float, help="SCAFFOLD global learning rate eta_g (default 1.0)."),
    click.option("--rolex-step", type=int, help="FedRolex: channels the window advances per round (default 1)."),
    click.option("--control-variates-dir", type=click.Path(),
                 help="SCAFFOLD (and DepthFL's FedDyn state h_i): keep per-client control variates on disk there "
                      "instead of in memory: a new or "
                      "empty folder (made and marked as hasfl-ray's) or one hasfl-ray marked, outside the run "
                      "directory; a folder of other files is refused."),
    click.option("--devices", metavar="SPEC",
                 help="Time rounds on a device population (docs/clock.md): a trace PATH.csv (e.g. "
                      "configs/devices/sample-trace.csv), fedscale:PATH (FedScale's client_device_capacity pickle), or "
                      "lognormal or pareto (seeded speeds, mobile bandwidths); "
                      "per-tier devices in a YAML config. Records simulated time and bytes; off by default."),
    click.option("--availability", metavar="MODEL",
                 help="With --devices: always, trace (the trace's intervals; the default when it has them) or "
                      "markov:ON,OFF (a seeded on/off chain of mean ON and OFF seconds) or fedscale:PATH (FedScale's "
                      "client_behave_trace pickle)."),
    click.option("--deadline", type=float, help="With --devices: a round's deadline in simulated seconds."),
    click.option("--deadline-policy", metavar="[drop|partial|overselect]",
                 help="What becomes of a late update: drop (default; discarded and counted), partial (the client "
                      "does the local steps that fit) or overselect (invite (1+F)K, keep the first K to finish)."),
    click.option("--overselect", type=float, metavar="F",
                 help="With --deadline-policy overselect: the fraction F of extra invitations (default 0.3)."),
    click.option("--dropout", type=float, metavar="P",
                 help="With --devices: the probability an invited client drops out mid-round (update lost; "
                      "default 0)."),
    click.option("--mode", metavar="[sync|async]",
                 help="sync (default): rounds; async: event-driven, C clients in flight, the server updating as "
                      "updates arrive (FedBuff or FedAsync; needs --devices, whose clock times them; docs/async.md)."),
    click.option("--concurrency", type=int, metavar="C",
                 help="With --mode async: clients training at once (default: --clients-per-round)."),
    click.option("--async-rule", metavar="[fedbuff|fedasync]",
                 help="With --mode async: fedbuff (default; buffer K updates, apply their staleness-weighted mean) "
                      "or fedasync (mix each arrival in with alpha s(tau))."),
    click.option("--buffer-size", type=int, metavar="K",
                 help="With --async-rule fedbuff: updates per server update (default min(10, C); at most C)."),
    click.option("--staleness", metavar="FN",
                 help="With --mode async: the staleness factor s(tau): polynomial:A ((1+tau)^-A; default "
                      "polynomial:0.5), hinge:A,B or constant."),
    click.option("--async-alpha", type=float, metavar="ALPHA",
                 help="With --async-rule fedasync: the mixing weight alpha in (0, 1] (default 0.6)."),
    click.option("--server-optimizer", metavar="[sgd|fedavgm|fedadam|fedyogi|fedadagrad]",
                 help="The server's step on the aggregated update, either mode: sgd (default: w + eta Delta), fedavgm "
                      "(heavy ball, --server-momentum, default 0.9) or Reddi et al.'s fedadam, fedyogi, fedadagrad "
                      "(docs/algorithms.md, 'Server optimisers')."),
    click.option("--server-lr", type=float, metavar="ETA",
                 help="The server learning rate eta (default 1 for sgd and fedavgm, times the algorithm's own, "
                      "scaffold's --scaffold-global-lr; fedadam 0.1, fedyogi 0.01, fedadagrad 0.1)."),
    click.option("--server-momentum", type=float, metavar="BETA",
                 help="With sgd or fedavgm (FedBuff's server momentum): beta in [0, 1) (default 0; fedavgm 0.9): each "
                      "server step is beta times the last plus eta times the mean update."),
    click.option("--server-beta1", type=float, metavar="B1",
                 help="With fedadam, fedyogi, fedadagrad: the first moment's beta1 in [0, 1) (default 0.9; "
                      "fedadagrad 0)."),
    click.option("--server-beta2", type=float, metavar="B2",
                 help="With fedadam or fedyogi: the second moment's beta2 in [0, 1) (default 0.99)."),
    click.option("--server-tau", type=float, metavar="TAU",
                 help="With fedadam, fedyogi, fedadagrad: the adaptivity tau > 0 in eta m / (sqrt(v) + tau) (default "
                      "1e-9; fedyogi 1e-3)."),
    click.option("--async-rho", type=float, metavar="RHO",
                 help="With --mode async: FedAsync's local proximal weight rho >= 0 (Xie et al.'s worker minimises "
                      "f(w) + rho/2 ||w - w_received||^2), for any algorithm (default 0: none)."),
    click.option("--eval-every-updates", type=int, metavar="N",
                 help="With --mode async: evaluate every N server updates (default 1; and after the last)."),
    click.option("--eval-every-seconds", type=float, metavar="S",
                 help="With --mode async: evaluate whenever S more simulated seconds have passed."),
    click.option("--dp-noise-multiplier", type=float, metavar="Z",
                 help="Client-level differential privacy (docs/privacy.md; needs the privacy extra): each update "
                      "clipped to --dp-clip over the coordinates it holds, Gaussian noise of std Z x clip on the sum, "
                      "divided by each coordinate's holders; epsilon in metrics.jsonl (dp_epsilon) every round."),
    click.option("--dp-clip", type=float, metavar="C",
                 help="With --dp-noise-multiplier: the L2 clip of each client's update (default 1; the start of "
                      "adaptive clipping)."),
    click.option("--dp-adaptive-quantile", type=float, metavar="GAMMA",
                 help="With --dp-noise-multiplier: adaptive clipping (Andrew et al. 2021), the clip moved toward the "
                      "GAMMA quantile of the update norms (e.g. 0.5)."),
    click.option("--dp-delta", type=float, help="With --dp-noise-multiplier: delta of the (epsilon, delta) reported "
                                                "(default clients^-1.1)."),
    click.option("--dp-epsilon", type=float, help="With --dp-noise-multiplier: stop before a round whose update would "
                                                  "take epsilon past this budget."),
    click.option("--dp-accountant", type=click.Choice(["rdp", "pld"]),
                 help="With --dp-noise-multiplier: rdp (default; fixed-size sampling without replacement) or pld "
                      "(no sampling amplification: an upper bound), both dp-accounting's."),
    click.option("--backend", help="ray or local (one process, no Ray); default auto: ray where Ray is installed, else "
                                   "local (the Python API's rule too)."),
    click.option("--actors", type=int, help="Ray trainer actors (default: one per GPU with --device cuda, else one "
                                            "per --trainer-threads CPU cores of the cluster)."),
    click.option("--gpus-per-actor", type=float, help="GPUs per trainer actor with --device cuda; fractions share a "
                                                      "GPU (default 0.9, leaving 0.1 for the server actor)."),
    click.option("--address", help="Join a running Ray cluster (HOST:PORT, ray://HOST:PORT or auto) instead of "
                                   "starting one on this machine."),
    click.option("--server-placement", metavar="[auto|driver|actor]",
                 help="Where a Ray run's server (the global model, aggregation) runs: driver (this process: a "
                      "round's results come straight to it, no hop through another actor), actor (an actor of its "
                      "own, with a share of a GPU on --device cuda) or auto (default: driver on a CPU run that "
                      "starts Ray here, else actor). The same results either way; docs/ray.md."),
    click.option("--checkpoint-every", type=int, help="Checkpoint every N rounds and after the last (default 10; "
                                                      "0 disables)."),
    _OWN,
    click.option("--aggregation-backend", help="auto (fused kernel when built), fused or reference."),
    click.option("--trainer-threads", type=int, help="CPU threads per trainer (fixed for determinism, default 1)."),
    click.option("--device", help="Torch device of trainers and server: auto (default: cuda where a GPU is visible, "
                                   "else cpu), cpu or cuda (Ray trainers each get a GPU or --gpus-per-actor of one)."),
    click.option("--client-batching", metavar="[auto|on|mixed|off]",
                 help="Train the clients of one width as one batched computation per local step: auto (default: off "
                      "everywhere, since no measurement has shown it ahead of one-at-a-time training in the "
                      "protocol's rounds, graphed on a GPU or on a CPU; docs/gpu.md), on, mixed (the clients of every width together, each padded to the widest "
                      "with its mask; by width for a model whose forward depends on it) or off. Agrees with "
                      "one-at-a-time training to float tolerance; recorded in config.yaml. With --precision bf16 or "
                      "another --local-optimizer than sgd every client trains one at a time (a warning says so)."),
    click.option("--cuda-graphs", metavar="[auto|on|off]",
                 help="Capture a whole local step (forward, backward, clip, SGD) once as a CUDA graph and replay it, "
                      "for the clients trained one at a time with plain cross-entropy: auto (default: on for --device "
                      "cuda, off on CPU), on or off. On a CPU, on runs the same static-buffer step eagerly (identical "
                      "results); recorded in config.yaml."),
    click.option("--precision", metavar="[fp32|bf16]",
                 help="The arithmetic of local training's forward and loss: fp32 (default; plain float32) or bf16 "
                      "(bfloat16 autocast; weights, gradients, the optimiser step and evaluation stay float32; "
                      "clients train one at a time). Changes results; recorded in config.yaml (docs/gpu.md)."),
    click.option("--fast-nondeterministic", is_flag=True, default=False,
                 help="On CUDA: let cuDNN autotune, use TF32 convolutions (torch's default; off by default here, "
                      "for exact float32) and torch use nondeterministic kernels (faster, but two runs of one config "
                      "no longer match bit for bit). No effect on CPU results."),
    click.option("--eval-batch-size", type=int, help="Evaluation batch size (default 500)."),
    click.option("--eval-samples", type=int,
                 help="Evaluate on a seeded random subset of this many test samples, the same every round and on every "
                      "backend (default: the whole test set; 0 = the whole test set; more than the test set holds = "
                      "the whole test set)."),
    click.option("--eval-widths", metavar="W1,W2,...",
                 help="Also evaluate the global model cut to each of these widths in (0, 1] (comma list; 1 is always "
                      "included; 'full' = the full model only). Default: the run's distinct p^max values and 1. "
                      "metrics.jsonl's accuracy_at_width, summary.json's final and best per width (docs/metrics.md)."),
    click.option("--eval-every", type=int,
                 help="Evaluate at each width every K rounds, and always after the last (default: 1 on digits and "
                      "synthetic, 5 otherwise)."),
    click.option("--test-every", type=int,
                 help="Evaluate test_accuracy (the full model, and its sBN statistics pass) every K rounds, and "
                      "always after the last; the other rounds' lines hold null (default 1: every round)."),
    click.option("--test-first/--no-test-first", default=None,
                 help="Also evaluate the first round (test_accuracy and every width), whatever --test-every and "
                      "--eval-every say (FIARSE's cadence; default off)."),
    click.option("--test-last", type=int, metavar="N",
                 help="Also evaluate each of the last N rounds (test_accuracy and every width; default 0: the last "
                      "round only)."),
    click.option("--test-phase", type=int, metavar="R",
                 help="Put --test-every's and --eval-every's cadences through the 1-based round R: rounds t with t "
                      "% K == R % K (default: rounds K, 2K, ...; the paper's figures: --test-every 5 --test-phase 1)."),
    click.option("--local-eval-every", type=int,
                 help="Evaluate every client's local accuracy every K rounds too (default 0: after the last round "
                      "only)."),
    click.option("--local-eval-width", type=click.Choice(["final", "p-max"]),
                 help="The width of a client's local accuracy: final (default: its p_final) or p-max (its tier)."),
    click.option("--local-eval-clients", metavar="N|all|off",
                 help="Which clients the local-accuracy pass scores: every client up to N clients, a seeded sample "
                      "of N beyond (summary.json says which; default 10000), all (every client, however many) or off "
                      "(no local-accuracy pass)."),
    click.option("--local-eval-rule", type=click.Choice(["labels", "source"]),
                 help="How local accuracy is scored: labels (default: the test samples of the client's labels, at "
                      "its own width, logits off its labels at -inf, mean over clients) or source (HeteroFL's and "
                      "FedRolex's: its own test shard of a classes:K partition, the global model, logits off its "
                      "label split set to 0, mean weighted by samples)."),
)


def run_options(*own: Callable) -> Callable:
    """A decorator that adds every shared run option to a click command, in :data:`RUN_OPTIONS` order, with the
    command's ``own`` options (click.option decorators) after --checkpoint-every. Options a command lists before
    or after these are decorated above or below it as usual."""
    options = [o for option in RUN_OPTIONS for o in (own if option is _OWN else (option,))]

    def apply(command: Callable) -> Callable:
        for option in reversed(options):  # click lists the decorator applied last first
            command = option(command)
        return command

    return apply


def apply_switches(flags: Dict[str, Any], no_coverage: bool, download: bool, fast_nondeterministic: bool) -> None:
    """Turn the on/off flags shared by `simulate` and `sweep` into config keys in ``flags``, and refuse --budget
    with --budget-from (one sentence)."""
    if no_coverage:
        flags["coverage"] = False
    if fast_nondeterministic:
        flags["deterministic"] = False
    if download:
        flags["download"] = True
    _comma_list(flags, "tier_counts", int, "4 comma-separated client counts, e.g. 4,10,3,3")
    _comma_list(flags, "widths", float, "comma-separated widths in (0, 1], e.g. 1,0.5,0.25,0.125,0.0625")
    _comma_list(flags, "lr_milestones", int, "comma-separated increasing round numbers, e.g. 150,250")
    if flags.get("augmentation") == "crop-flip":
        flags["augmentation"] = "crop_flip"
    if not (isinstance(flags.get("eval_widths"), str) and flags["eval_widths"].strip() == "full"):  # RunConfig's
        _comma_list(flags, "eval_widths", float, "comma-separated widths in (0, 1], e.g. 0.25,0.5,0.75,1, or full")
    count = flags.get("local_eval_clients")
    if isinstance(count, str) and count.strip().isdigit():  # N; all and off stay words (anything else: refused)
        flags["local_eval_clients"] = int(count.strip())
    if flags.get("local_eval_width") == "p-max":
        flags["local_eval_width"] = "p_max"
    if isinstance(flags.get("global_width"), str) and flags["global_width"].strip() != "first":
        try:
            flags["global_width"] = float(flags["global_width"])
        except ValueError:
            raise ConfigError(f"--global-width is {flags['global_width']!r}; expected a width in (0, 1] or first "
                              "(the first level of --width-mix)") from None
    for key in ("sbn_statistics", "sbn_statistics_data"):
        if flags.get(key) in ("in-order", "test-batch", "training-set"):
            flags[key] = flags[key].replace("-", "_")
    if flags.get("budget") is not None and flags.get("budget_from") is not None:
        raise ConfigError(f"--budget {flags['budget']} and --budget-from {flags['budget_from']!r} are both given; "
                          "expected one source for random-budget's target")


def _comma_list(flags: Dict[str, Any], key: str, convert, expected: str) -> None:
    """``flags[key]``, a comma-separated string from the command line, as a list of ``convert``ed values; one
    sentence naming the flag when a value does not convert."""
    text = flags.get(key)
    if isinstance(text, str):
        try:
            flags[key] = [convert(value) for value in text.split(",")]
        except ValueError:
            raise ConfigError(f"--{key.replace('_', '-')} is {text!r}; expected {expected}") from None


def default_backend(ray_options_given: bool) -> str:
    """What a command runs on when --backend is not given: the one rule of the CLI and the Python API
    (:func:`hasfl_ray.config.default_backend`: ``ray`` where Ray is installed, else ``local``), with the
    install hint when Ray-only options were given on a machine without Ray."""
    from hasfl_ray.config.runconfig import default_backend as shared_rule

    backend = shared_rule()
    if backend == "local" and ray_options_given:
        require_ray()
    return backend
