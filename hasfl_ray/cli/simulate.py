"""`hasfl-ray simulate`: run one federated experiment and write its run directory."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from typing import Any, Dict

import click

from hasfl_ray.cli.common import setup_logging, user_errors
from hasfl_ray.cli.main import main
from hasfl_ray.errors import ConfigError, RunInterrupted

#: Fields only the Ray backend uses: given without --backend on a machine without Ray, they ask for Ray.
_RAY_FIELDS = ("actors", "gpus_per_actor", "address", "fault_inject")


def apply_switches(flags: Dict[str, Any], no_coverage: bool, download: bool, fast_nondeterministic: bool) -> None:
    """Turn the on/off flags shared by `simulate` and `sweep` into config keys in ``flags``, and refuse --budget
    with --budget-from (one sentence)."""
    if no_coverage:
        flags["coverage"] = False
    if fast_nondeterministic:
        flags["deterministic"] = False
    if download:
        flags["download"] = True
    counts = flags.get("tier_counts")
    if isinstance(counts, str):
        try:
            flags["tier_counts"] = [int(n) for n in counts.split(",")]
        except ValueError:
            raise ConfigError(f"--tier-counts is {counts!r}; expected 4 comma-separated client counts, e.g. "
                              "4,10,3,3") from None
    if flags.get("budget") is not None and flags.get("budget_from") is not None:
        raise ConfigError(f"--budget {flags['budget']} and --budget-from {flags['budget_from']!r} are both given; "
                          "expected one source for random-budget's target")


def build_config(config_file: str | None, flags: Dict[str, Any], base: Dict[str, Any] | None = None):
    """RunConfig from ``base`` (a resumed run's config.yaml), then the YAML file (if any), then the flags given."""
    from hasfl_ray.engine.config import RunConfig, load_yaml_config, single_run_values
    from hasfl_ray.registry import parse_option_assignments

    source = f"config file {config_file!r}" if config_file else "config"
    flags = dict(flags)
    options = parse_option_assignments(flags.pop("algo_opt", None))  # --algo-opt KEY=VALUE, over the YAML's
    # a sweep config (README, "Reproducing the paper") gives one run: its shared keys, its first dataset, algorithm
    # and seed unless flags name others, that dataset's per_dataset keys and the variant --algorithm names
    values = single_run_values(load_yaml_config(config_file), flags, source) if config_file else {}
    if config_file:
        RunConfig.from_dict({k: v for k, v in values.items()}, source)  # unknown keys refused before flags apply
    values = {**(base or {}), **values}
    values.update({k: v for k, v in flags.items() if v is not None})
    if options:
        given = values.get("algorithm_options") or {}
        if not isinstance(given, dict):
            raise ConfigError(f"{source} has algorithm_options {given!r}; expected a mapping of option names to "
                              "values")
        values["algorithm_options"] = {**given, **options}
    if values.get("backend") is None:
        values["backend"] = default_backend(any(values.get(k) is not None for k in _RAY_FIELDS))
    return RunConfig.from_dict(values, source)


def resume_base(stored: Dict[str, Any], flags: Dict[str, Any]) -> Dict[str, Any]:
    """The stored config a resume starts from, without what is not run state: ``fault_inject`` (a test's one-shot
    fault, which would fire again), and, when the flags name another backend, the stored backend's own placement
    (``actors``, ``gpus_per_actor``, ``address``), so a Ray run can be finished locally and the other way round."""
    base = {k: v for k, v in stored.items() if k != "fault_inject"}
    if flags.get("backend") is not None and flags["backend"] != base.get("backend"):
        for key in ("backend",) + tuple(k for k in _RAY_FIELDS if k != "fault_inject"):
            base.pop(key, None)
    return base


def default_backend(ray_options_given: bool) -> str:
    """``ray`` where Ray is installed, else ``local`` (or the install hint when Ray-only options were given)."""
    from hasfl_ray.simulation import ray_available, require_ray

    if ray_available():
        return "ray"
    if ray_options_given:
        require_ray()
    return "local"


@main.command()
@click.option("--dataset", help="digits (embedded, default), emnist, cifar10, shakespeare, synthetic, or a plug-in: "
                                "FILE.py:Class or MODULE:Class (README, \"Bring your own policy\").")
@click.option("--data-dir", type=click.Path(), help="Where the dataset lives (a torchvision root for images).")
@click.option("--download", is_flag=True, default=None, help="Download the dataset if it is missing.")
@click.option("--algorithm", help="hasfl (default), heterofl, fjord, uniform, random-budget, fedavg, fedprox, "
                                  "scaffold or fedrolex (the README's algorithm table), or a plug-in: FILE.py:Class "
                                  "or MODULE:Class subclassing hasfl_ray.Algorithm.")
@click.option("--algo-opt", multiple=True, metavar="KEY=VALUE",
              help="An option of a plug-in algorithm (its options dataclass); repeat for several. Overrides the YAML's "
                   "algorithm_options mapping.")
@click.option("--rounds", type=int, help="Communication rounds T (default: the dataset's protocol).")
@click.option("--clients", type=int, help="Number of clients N (default 20).")
@click.option("--clients-per-round", type=int, help="Participants sampled per round (default 10).")
@click.option("--seed", type=int, help="Seed of partition, tiers, initialisation, sampling and training (default 42).")
@click.option("--alpha", type=float, help="Dirichlet label-skew concentration (default 0.3).")
@click.option("--synthetic-alpha", type=float, help="Synthetic(alpha, beta): labeller heterogeneity (default 1).")
@click.option("--synthetic-beta", type=float, help="Synthetic(alpha, beta): input heterogeneity (default 1).")
@click.option("--local-epochs", type=int, help="Local epochs K (default: the dataset's protocol).")
@click.option("--batch-size", type=int, help="Local batch size (default 32).")
@click.option("--lr", type=float, help="Initial local learning rate, decayed x0.995 per round.")
@click.option("--momentum", type=float, help="Local SGD momentum (default 0.9; 0 for scaffold).")
@click.option("--p-min", type=float, help="HAS-FL base capacity p_min (default 0.4).")
@click.option("--gamma", type=float, help="HAS-FL sensitivity gamma (default 0.25).")
@click.option("--beta", type=float, help="HAS-FL EMA factor beta (default 0.9).")
@click.option("--t-adapt", type=int, help="HAS-FL adaptation interval (default 5).")
@click.option("--warmup", type=int, help="HAS-FL warm-up rounds (default 10).")
@click.option("--t-norm", type=int, help="HAS-FL normalisation interval (default 20).")
@click.option("--estimator", type=click.Choice(["masked", "common-core"]),
              help="HAS-FL divergence estimator: masked (default; each client's own coordinates) or common-core "
                   "(only the coordinates every participant of the round covers).")
@click.option("--tier-counts", metavar="N1,N2,N3,N4",
              help="Clients per capacity tier p^max 0.25,0.5,0.75,1.0 (default: the text's 8,5,4,3 of 20; "
                   "4,10,3,3 is the mix of the paper's own runs).")
@click.option("--no-coverage", is_flag=True, default=False,
              help="Disable the coverage guarantee of hasfl and random-budget (ablation).")
@click.option("--mu", type=float, help="FedProx proximal weight mu (default 1.0).")
@click.option("--budget", type=float, help="random-budget's target average width after warm-up (default: HAS-FL's "
                                          "allocation under equal estimates, 0.505 for 20 clients).")
@click.option("--budget-from", type=click.Path(), help="random-budget: take the target from RUN/summary.json's "
                                                       "avg_p_post_warmup (e.g. a HAS-FL run directory, same seed).")
@click.option("--heterofl-weighting", type=click.Choice(["samples", "count"]),
              help="heterofl aggregation weights: samples n_i (default, the paper's) or count (HeteroFL's original).")
@click.option("--fjord-distill-weight", type=float, help="FjORD self-distillation weight (default 1.0).")
@click.option("--scaffold-global-lr", type=float, help="SCAFFOLD global learning rate eta_g (default 1.0).")
@click.option("--rolex-step", type=int, help="FedRolex: channels the window advances per round (default 1).")
@click.option("--control-variates-dir", type=click.Path(),
              help="SCAFFOLD: keep per-client control variates on disk there instead of in memory.")
@click.option("--backend", help="ray (default where Ray is installed) or local (one process, no Ray).")
@click.option("--actors", type=int, help="Ray trainer actors (default: one per GPU with --device cuda, else one "
                                         "per --trainer-threads CPU cores of the cluster).")
@click.option("--gpus-per-actor", type=float, help="GPUs per trainer actor with --device cuda; fractions share a "
                                                   "GPU (default 0.9, leaving 0.1 for the server actor).")
@click.option("--address", help="Join a running Ray cluster (HOST:PORT, ray://HOST:PORT or auto) instead of "
                                "starting one on this machine.")
@click.option("--checkpoint-every", type=int, help="Checkpoint every N rounds and after the last (default 10; "
                                                   "0 disables).")
@click.option("--resume", is_flag=True, help="Continue the run directory from its last checkpoint; the result is "
                                             "bit-identical to an uninterrupted run.")
@click.option("--fault-inject", hidden=True, help="Testing: kill-trainer@ROUND kills a Ray trainer actor mid-round.")
@click.option("--aggregation-backend", help="auto (fused kernel when built), fused or reference.")
@click.option("--trainer-threads", type=int, help="CPU threads per trainer (fixed for determinism, default 1).")
@click.option("--device", help="Torch device of trainers and server: auto (default: cuda where a GPU is visible, "
                                "else cpu), cpu or cuda (Ray trainers each get a GPU or --gpus-per-actor of one).")
@click.option("--client-batching", metavar="[auto|on|off]",
              help="Train the clients of one width as one batched computation per local step: auto (default: on "
                   "for --device cuda, off on CPU), on or off. Agrees with one-at-a-time training to float "
                   "tolerance; recorded in config.yaml.")
@click.option("--cuda-graphs", metavar="[auto|on|off]",
              help="Capture a whole local step (forward, backward, clip, SGD) once as a CUDA graph and replay it, "
                   "for the clients trained one at a time with plain cross-entropy: auto (default: on for --device "
                   "cuda, off on CPU), on or off. On a CPU, on runs the same static-buffer step eagerly (identical "
                   "results); recorded in config.yaml.")
@click.option("--fast-nondeterministic", is_flag=True, default=False,
              help="On CUDA: let cuDNN autotune, use TF32 convolutions (torch's default; off by default here, "
                   "for exact float32) and torch use nondeterministic kernels (faster, but two runs of one config "
                   "no longer match bit for bit). No effect on CPU results.")
@click.option("--eval-batch-size", type=int, help="Evaluation batch size (default 500).")
@click.option("--eval-samples", type=int,
              help="Evaluate on a seeded random subset of this many test samples, the same every round and on every "
                   "backend (default: the whole test set; 0 = the whole test set; more than the test set holds = "
                   "the whole test set).")
@click.option("--config", "config_file", type=str, help="YAML file of config keys; flags override it.")
@click.option("--out", type=click.Path(), help="Run directory (default runs/<dataset>-<algorithm>-seed<seed>).")
@click.option("--force", is_flag=True, help="Overwrite an existing run directory (with --resume: continue it "
                                            "even if its config differs).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
@user_errors
def simulate(config_file, out, force, resume, quiet, verbose, no_coverage, download, fast_nondeterministic,
             **flags) -> None:
    """Run a federated experiment and write config.yaml, metrics.jsonl, clients.csv and summary.json."""
    setup_logging(verbose)
    apply_switches(flags, no_coverage, download, fast_nondeterministic)
    config = build_config(config_file, flags).resolved()
    from hasfl_ray.registry import spec_label

    label = f"{spec_label(config.dataset)}-{spec_label(config.algorithm)}-seed{config.seed}"  # a plug-in: its class
    if out is not None and not out.strip():
        raise ConfigError(f"--out is {out!r}; expected a folder path (or no --out for runs/{label})")
    out = out if out is not None else os.path.join("runs", label)
    if resume and os.path.exists(os.path.join(out, "config.yaml")):
        # Resuming needs only --out: the run's own config is the base; flags given on top must agree with it.
        from hasfl_ray.engine.config import load_yaml_config

        config = build_config(config_file, flags, base=resume_base(load_yaml_config(os.path.join(out, "config.yaml")),
                                                                   flags)).resolved()
    if os.path.exists(os.path.join(out, "config.yaml")) and not (force or resume):
        raise ConfigError(f"run directory {out!r} already holds a run; expected a new directory, --resume to "
                          "continue it, or --force to overwrite it")

    from hasfl_ray.engine import Engine

    engine = Engine(config, out_dir=out, progress=not quiet, resume=resume, force=force)
    engine.prepare()  # bad data or config (or a config that differs from the one resumed) fails here
    try:
        summary = engine.run()
    except RunInterrupted as stop:
        name = signal.Signals(stop.signal_number).name
        saved = "checkpoint written" if stop.rounds_done else "nothing to checkpoint yet"
        click.echo(f"Stopped by {name} after {stop.rounds_done} completed rounds ({saved}); resume with: "
                   f"hasfl-ray simulate --out {shlex.quote(out)} --resume", err=True)
        sys.exit(128 + stop.signal_number)
    click.echo(json.dumps(summary, indent=2))
    click.echo(f"run directory: {out}")
