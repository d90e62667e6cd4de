"""`hasfl-ray report`: the paper's tables from finished run directories."""

from __future__ import annotations

import glob
import json
import os

import click

from hasfl_ray.cli.common import user_errors
from hasfl_ray.errors import ConfigError


def find_runs(paths):
    """Finished runs under PATHS (run directories or folders holding them), read; one sentence if none."""
    from hasfl_ray.analysis import read_run

    run_dirs = []
    for path in paths:
        if os.path.isfile(os.path.join(path, "summary.json")):
            run_dirs.append(path)
        else:
            run_dirs += sorted(os.path.dirname(p) for p in glob.glob(os.path.join(path, "**", "summary.json"),
                                                                     recursive=True))
    if not run_dirs:
        raise ConfigError(f"no finished runs under {', '.join(paths)}; expected run directories holding summary.json")
    return [read_run(path) for path in run_dirs]


def sweep_description(paths):
    """sweep.json of the first PATH that is a sweep's folder (its algorithm order and what it reproduces), or {}."""
    for path in paths:
        try:
            with open(os.path.join(path, "sweep.json"), encoding="utf-8") as handle:
                data = json.load(handle)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            continue
    return {}


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--out", "out_dir", type=click.Path(),
              help="Write table.{md,csv,tex}, confound.{md,csv,tex}, analysis.json and the figures (PNG) here "
                   "(default for a sweep's folder: PATH/report).")
@user_errors
def report(paths, as_json, out_dir) -> None:
    """Mean ± std over seeds of best/final accuracy, peak-to-final change and avg p per (dataset, algorithm), and
    the confound correlations of Table 5 per run. PATHS are run directories, folders holding them, or a sweep's
    folder (then the files and figures are written too)."""
    from hasfl_ray.analysis import analyze_runs, summarise_runs
    from hasfl_ray.analysis.write import write_report

    runs = find_runs(paths)
    sweep = sweep_description(paths)
    order = sweep.get("algorithms") or ()
    table = summarise_runs(runs, order)
    analysis = analyze_runs(runs)
    confound = analysis["runs"]
    if out_dir is None and sweep and len(paths) == 1:
        out_dir = os.path.join(paths[0], "report")
    written = write_report(runs, out_dir, order, sweep.get("reproduces", "")) if out_dir else []
    if as_json:
        click.echo(json.dumps({"table": table, "confound": confound, "pooled": analysis["pooled"],
                               "files": written}, indent=2))
        return
    click.echo(f"{'dataset':<12} {'algorithm':<22} {'seeds':>5} {'best':>13} {'final':>13} {'peak->final':>11} "
               f"{'avg p':>6}")
    for row in table:
        click.echo(f"{row['dataset']:<12} {row['algorithm']:<22} {len(row['seeds']):>5} "
                   f"{row['best_mean']:>6.1f} ± {row['best_std']:<4.1f} {row['final_mean']:>6.1f} ± "
                   f"{row['final_std']:<4.1f} {row['peak_to_final']:>+11.1f} {row['avg_p']:>6.2f}")
    if confound:
        _echo_confound(analysis)
    for path in written:
        click.echo(f"wrote {path}")


def _fmt(row, key):
    r, pvalue = row.get(key), row.get("pvalue_" + key[2:])
    if r is None:
        return f"{'n/a':>15}"
    return f"{r:+.2f} (p={pvalue:.2g})".rjust(15) if pvalue is not None else f"{r:+15.2f}"


def _echo_confound(analysis) -> None:
    click.echo("\nconfound (Table 5):   n       r(H, TV)      r(H, p_max)  r(H, TV | p_max)  r(p, TV | p_max)")
    for row in analysis["runs"]:
        click.echo(f"  {row['dataset']}/{row['algorithm']}/s{row['seed']:<6} {row['n_clients']:>3} "
                   + " ".join(_fmt(row, k) for k in ("r_h_tv", "r_h_pmax", "r_h_tv_given_pmax", "r_p_tv_given_pmax"))
                   + f"  {row['run']}")
    for row in analysis["pooled"]:
        if not row.get("n_clients"):
            continue
        click.echo(f"  {row['dataset']}/{row['algorithm']}/pooled {row['n_clients']:>3} "
                   + " ".join(_fmt(row, k) for k in ("r_h_tv", "r_h_pmax", "r_h_tv_given_pmax", "r_p_tv_given_pmax"))
                   + f"  seeds {', '.join(str(s) for s in row['seeds'])}")
    for row in analysis["pooled"]:
        if row.get("verdict"):
            click.echo(f"verdict, {row['dataset']}/{row['algorithm']} pooled over seeds "
                       f"{', '.join(str(s) for s in row['seeds'])}: {row['verdict']}")


@click.command()
@click.argument("runs", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON: runs (per run) and pooled (over seeds).")
@user_errors
def analyze(runs, as_json) -> None:
    """Table 5 of the paper: r(H̃, TV), r(H̃, p max), r(H̃, TV | p max) and r(p, TV | p max) with p-values and client
    counts, per run and pooled over the seeds of each (dataset, algorithm), and a verdict in plain words. Each
    run's result is written into its summary.json as an `analysis` block. RUNS are run directories or folders
    holding them (runs without H̃ estimates are left out)."""
    from hasfl_ray.analysis.report import analyze_runs, write_analysis

    found = find_runs(runs)
    analysis = analyze_runs(found)
    if not analysis["runs"]:
        raise ConfigError(f"no run under {', '.join(runs)} has H̃ estimates (h_tilde in clients.csv); expected "
                          "hasfl runs with at least 4 clients")
    for run in found:
        write_analysis(run)
    if as_json:
        click.echo(json.dumps(analysis, indent=2))
        return
    _echo_confound(analysis)
    for row in analysis["runs"]:
        click.echo(f"verdict, {row['run']}: {row['verdict']}")


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--out", "out_dir", default="figures", show_default=True, help="Folder for the PNG files.")
@user_errors
def plot(paths, out_dir) -> None:
    """The paper's figures per dataset: convergence, mean H̃ and p per round, per-client p against p max,
    and the accuracy-capacity frontier. PATHS are run directories or folders holding them."""
    from hasfl_ray.analysis.plots import plot_runs

    for path in plot_runs(find_runs(paths), out_dir):
        click.echo(path)
