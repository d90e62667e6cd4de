"""`hasfl-ray simulate`: run one federated experiment and write its run directory."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict

import click

from hasfl_ray.cli.common import setup_logging, user_errors
from hasfl_ray.cli.main import main
from hasfl_ray.errors import ConfigError

# Flags that map one-to-one onto RunConfig fields (None = not given, so the YAML/default stands).
_FIELD_FLAGS = ("dataset", "data_dir", "algorithm", "rounds", "clients", "clients_per_round", "seed", "alpha",
                "local_epochs", "batch_size", "lr", "momentum", "p_min", "gamma", "beta", "t_adapt", "warmup",
                "t_norm", "mu", "budget", "budget_from", "heterofl_weighting", "fjord_distill_weight",
                "scaffold_global_lr", "rolex_step", "backend", "aggregation_backend", "trainer_threads", "device",
                "eval_batch_size", "control_variates_dir")


def build_config(config_file: str | None, flags: Dict[str, Any]):
    """RunConfig from the YAML file (if any) overridden by the flags that were given."""
    from hasfl_ray.engine.config import RunConfig, load_yaml_config

    values = load_yaml_config(config_file) if config_file else {}
    source = f"config file {config_file!r}" if config_file else "config"
    if config_file:
        RunConfig.from_dict({k: v for k, v in values.items()}, source)  # unknown keys refused before flags apply
    values.update({k: v for k, v in flags.items() if v is not None})
    return RunConfig.from_dict(values, source)


@main.command()
@click.option("--dataset", help="digits (embedded, default), emnist, cifar10, shakespeare, synthetic.")
@click.option("--data-dir", type=click.Path(), help="Where the dataset lives (a torchvision root for images).")
@click.option("--download", is_flag=True, default=None, help="Download the dataset if it is missing.")
@click.option("--algorithm", help="hasfl (default), heterofl, fjord, uniform, random-budget, fedavg, fedprox, "
                                  "scaffold or fedrolex; see the README's algorithm table.")
@click.option("--rounds", type=int, help="Communication rounds T (default: the dataset's protocol).")
@click.option("--clients", type=int, help="Number of clients N (default 20).")
@click.option("--clients-per-round", type=int, help="Participants sampled per round (default 10).")
@click.option("--seed", type=int, help="Seed of partition, tiers, initialisation, sampling and training (default 42).")
@click.option("--alpha", type=float, help="Dirichlet label-skew concentration (default 0.3).")
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
@click.option("--no-coverage", is_flag=True, default=False,
              help="Disable the coverage guarantee of hasfl and random-budget (ablation).")
@click.option("--mu", type=float, help="FedProx proximal weight mu (default 1.0).")
@click.option("--budget", type=float, help="random-budget's target average width (default: the paper's HAS-FL "
                                          "average, 0.52; 0.53 on shakespeare).")
@click.option("--budget-from", type=click.Path(), help="random-budget: take the target from RUN/summary.json's "
                                                       "avg_p (e.g. a HAS-FL run directory).")
@click.option("--heterofl-weighting", type=click.Choice(["samples", "count"]),
              help="heterofl aggregation weights: samples n_i (default, the paper's) or count (HeteroFL's original).")
@click.option("--fjord-distill-weight", type=float, help="FjORD self-distillation weight (default 1.0).")
@click.option("--scaffold-global-lr", type=float, help="SCAFFOLD global learning rate eta_g (default 1.0).")
@click.option("--rolex-step", type=int, help="FedRolex: channels the window advances per round (default 1).")
@click.option("--control-variates-dir", type=click.Path(),
              help="SCAFFOLD: keep per-client control variates on disk there instead of in memory.")
@click.option("--backend", help="local (in-process) or ray.")
@click.option("--aggregation-backend", help="auto (fused kernel when built), fused or reference.")
@click.option("--trainer-threads", type=int, help="CPU threads per trainer (fixed for determinism, default 1).")
@click.option("--device", help="Torch device of trainers and server for the local backend (default cpu).")
@click.option("--eval-batch-size", type=int, help="Evaluation batch size (default 500).")
@click.option("--config", "config_file", type=str, help="YAML file of config keys; flags override it.")
@click.option("--out", type=click.Path(), help="Run directory (default runs/<dataset>-<algorithm>-seed<seed>).")
@click.option("--force", is_flag=True, help="Overwrite an existing run directory.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
@user_errors
def simulate(config_file, out, force, quiet, verbose, no_coverage, download, **flags) -> None:
    """Run a federated experiment and write config.yaml, metrics.jsonl, clients.csv and summary.json."""
    setup_logging(verbose)
    if no_coverage:
        flags["coverage"] = False
    if flags.get("budget") is not None and flags.get("budget_from") is not None:
        raise ConfigError(f"--budget {flags['budget']} and --budget-from {flags['budget_from']!r} are both given; "
                          "expected one source for random-budget's target")
    if download:
        flags["download"] = True
    config = build_config(config_file, flags).resolved()
    out = out or os.path.join("runs", f"{config.dataset}-{config.algorithm}-seed{config.seed}")
    if os.path.exists(os.path.join(out, "config.yaml")) and not force:
        raise ConfigError(f"run directory {out!r} already holds a run; expected a new directory, or --force to "
                          "overwrite it")

    from hasfl_ray.engine import Engine, LocalBackend

    engine = Engine(config, out_dir=out, backend=LocalBackend(), progress=not quiet)
    engine.prepare()  # bad data or config fails here, before the run directory exists
    if force and os.path.isdir(out):
        shutil.rmtree(out)
    summary = engine.run()
    click.echo(json.dumps(summary, indent=2))
    click.echo(f"run directory: {out}")
