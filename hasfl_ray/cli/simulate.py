"""`hasfl-ray simulate`: run one federated experiment and write its run directory."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from typing import Any, Dict

import click

from hasfl_ray.cli.common import setup_logging, user_errors
from hasfl_ray.cli.options import apply_switches, run_options
from hasfl_ray.cli.sections import SectionedCommand
from hasfl_ray.errors import ConfigError, RunInterrupted
from hasfl_ray.registry import spec_label

#: Fields only the Ray backend uses: given without --backend on a machine without Ray, they ask for Ray.
_RAY_FIELDS = ("actors", "gpus_per_actor", "address", "server_placement", "fault_inject")


def build_config(config_file: str | None, flags: Dict[str, Any], base: Dict[str, Any] | None = None):
    """RunConfig from ``base`` (a resumed run's config.yaml), then the YAML file (if any), then the flags given.

    Keys naming the algorithm's options (``mu``, ``--p-min``) go to its ``algorithm_options``; a config file's
    options for other algorithms (a sweep config's shared keys) are dropped, a flag's refused in one sentence."""
    from hasfl_ray.config import (RunConfig, check_inert_keys, given_keys, load_yaml_config, merge_layers,
                                  parse_option_assignments, shared_keys, single_run_values)

    source = f"config file {config_file!r}" if config_file else "config"
    flags = dict(flags)
    options = parse_option_assignments(flags.pop("algo_opt", None))  # --algo-opt KEY=VALUE, over the YAML's
    # a sweep config (docs/configs.md, sweep configs) gives one run: its shared keys, its first dataset, algorithm
    # and seed unless flags name others, that dataset's per_dataset keys and the variant --algorithm names
    raw = load_yaml_config(config_file) if config_file else {}
    shared = shared_keys(raw, flags, source) - set(k for k, v in flags.items() if v is not None)  # for many runs
    shared_options = shared_keys(raw, flags, source, variants=False) & shared  # for every algorithm
    values = single_run_values(raw, flags, source) if config_file else {}
    if config_file:
        # unknown keys refused before flags apply, with the flags that the file's checks read beside its own keys
        # (input_normalization against the dataset: either may be the flag's)
        paired = {k: flags[k] for k in ("dataset", "input_normalization") if flags.get(k) is not None}
        RunConfig.from_dict({**values, **paired}, source, foreign="drop")
    given = {k: v for k, v in flags.items() if v is not None}
    layers = [(base or {}, "drop"), (values, "drop"), (given, "refuse")]
    if options:
        layers.append(({"algorithm_options": options}, "refuse"))
    merged = merge_layers(layers, source)
    config = RunConfig.from_dict(merged, source)  # each value checked first
    explicit = given_keys([values, given])  # the user's keys, never a stored run's
    if options:  # --algo-opt's, beside a config file's algorithm_options
        earlier = explicit.get("algorithm_options")
        explicit["algorithm_options"] = {**(earlier if isinstance(earlier, dict) else {}), **options}
    check_inert_keys(explicit, merged, source, shared, shared_options)
    return config


def resume_base(stored: Dict[str, Any], flags: Dict[str, Any]) -> Dict[str, Any]:
    """The stored config a resume starts from, without what is not run state: ``fault_inject`` (a test's one-shot
    fault, which would fire again), and, when the flags name another backend, the stored backend's own placement
    (``actors``, ``gpus_per_actor``, ``address``), so a Ray run can be finished locally and the other way round; a
    backend named by the flags also drops the stored ``handoff`` (``--backend ray`` is Ray from the first round)."""
    base = {k: v for k, v in stored.items() if k != "fault_inject"}
    if flags.get("backend") is not None:  # named now: the local-first start is the default backend's only
        base.pop("handoff", None)
    if flags.get("backend") is not None and flags["backend"] != base.get("backend"):
        for key in ("backend",) + tuple(k for k in _RAY_FIELDS if k != "fault_inject"):
            base.pop(key, None)
    return base


def stored_run_base(out: str, flags: Dict[str, Any]) -> Dict[str, Any] | None:
    """Resuming needs only --out: the run's own config.yaml (of any version, migrated) is the base the flags go on,
    and they must agree with it; None when ``out`` holds no run."""
    from hasfl_ray.config import load_yaml_config, migrate_config

    path = os.path.join(out, "config.yaml")
    if not os.path.exists(path):
        return None
    return resume_base(migrate_config(load_yaml_config(path), f"config file {path!r}"), flags)


def unfinished_run(out: str) -> bool:
    """Whether the run directory ``out`` holds a run stopped (or still running) after a checkpoint: no summary.json,
    a checkpoints/latest.pt. Running the same configuration again without --out would clear it."""
    return not os.path.lexists(os.path.join(out, "summary.json")) and \
        os.path.lexists(os.path.join(out, "checkpoints", "latest.pt"))


@click.command(cls=SectionedCommand)  # --help in sections: Data, Model, ... (hasfl_ray.cli.sections)
@run_options(
    click.option("--resume", is_flag=True, help="Continue the run directory from its last checkpoint; the result is "
                                                "bit-identical to an uninterrupted run."),
    click.option("--fault-inject", hidden=True,
                 help="Testing: kill-trainer@ROUND kills a Ray trainer actor mid-round."),
)
@click.option("--config", "config_file", type=str, help="YAML file of config keys; flags override it.")
@click.option("--out", type=click.Path(), help="Run directory (default runs/<dataset>-<algorithm>-s<seed>-<8 hex of "
                                               "the config's sha256>, one per configuration; runs/latest links to "
                                               "the last run started under runs/).")
@click.option("--force", is_flag=True, help="Overwrite an existing run directory (with --resume: continue it "
                                            "even if its config differs).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--track", type=click.Choice(["mlflow", "wandb"]), multiple=True,
              help="Also log the run to an experiment tracker (repeatable): mlflow (MLFLOW_TRACKING_URI) or wandb "
                   "(WANDB_MODE=offline needs no account); docs/notebook.md#trackers.")
@click.option("--json", "as_json", is_flag=True, help="End by printing summary.json (strict JSON) instead of the "
                                                      "readable summary.")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
@user_errors
def simulate(config_file, out, force, resume, quiet, track, as_json, verbose, no_coverage, download, fast_nondeterministic,
             **flags) -> None:
    """Run a federated experiment and write config.yaml, metrics.jsonl, clients.csv and summary.json."""
    setup_logging(verbose)
    apply_switches(flags, no_coverage, download, fast_nondeterministic)
    from hasfl_ray.cli.run_folder import default_out, link_latest, unlink_latest
    from hasfl_ray.engine.earlier_run import settle_unlocked

    given_out = out if out is not None and out.strip() else None
    if given_out and os.path.isdir(given_out):  # a --force start killed in between: read as settled (earlier_run)
        settle_unlocked(given_out)
    base = stored_run_base(given_out, flags) if resume and given_out else None
    config = build_config(config_file, flags, base=base).resolved()
    if out is not None and not out.strip():
        raise ConfigError(f"--out is {out!r}; expected a folder path (or no --out for {default_out(config)})")
    # no --out: the configuration's own folder (cli/run_folder.py), so runs of other configs never collide; the
    # same configuration again starts over there (as --force would: only a run's files are cleared) or --resume's it
    if out is None and os.path.isdir(default_out(config)):
        settle_unlocked(default_out(config))
    replace = out is None and not resume and os.path.exists(os.path.join(default_out(config), "config.yaml"))
    out = out if out is not None else default_out(config)
    if replace and not force and unfinished_run(out):  # its checkpoint is progress: never cleared unasked
        raise ConfigError(f"{out} holds an unfinished run of this configuration (a checkpoint, no summary.json); "
                          "expected --resume to continue it, or --force to start it again")
    if resume and base is None and os.path.exists(os.path.join(out, "config.yaml")):
        config = build_config(config_file, flags, base=stored_run_base(out, flags)).resolved()
    if resume and config.backend == "ray" and config.address and flags.get("address") is None and \
            (stored_run_base(out, flags) or {}).get("address") == config.address:  # the cluster the run joined
        from hasfl_ray.simulation import STORED_ADDRESS, probe_address

        probe_address(config.address, STORED_ADDRESS)

    from hasfl_ray.engine import Engine
    from hasfl_ray.trackers import make_trackers

    engine = Engine(config, out_dir=out, progress=not quiet, resume=resume, force=force or replace,
                    callbacks=make_trackers(track))
    engine.prepare()  # bad data or config (or a config that differs from the one resumed) fails here
    if replace:
        click.echo(f"{out} holds an earlier run of this configuration; starting it again there (--resume continues "
                   "a stopped one)", err=True)
    made_runs = link_latest(out)
    try:
        summary = engine.run()
    except ConfigError:  # a start refused after prepare (Ray's placement, a first dispatch) left no run directory
        unlink_latest(out, made_runs)
        raise
    except RunInterrupted as stop:
        name = signal.Signals(stop.signal_number).name
        saved = "checkpoint written" if stop.rounds_done else "nothing to checkpoint yet"
        click.echo(f"Stopped by {name} after {stop.done} ({saved}); resume with: "
                   f"hasfl-ray simulate --out {shlex.quote(out)} --resume", err=True)
        sys.exit(128 + stop.signal_number)
    if as_json:
        from hasfl_ray.engine.rundir import summary_json

        click.echo(summary_json(summary), nl=False)
        return
    from hasfl_ray.cli.summary import readable_summary

    click.echo(readable_summary(summary, out, spec_label(config.algorithm), spec_label(config.dataset), config.seed,
                                config.precision))
