"""`hasfl-ray report`: the paper's tables from finished run directories."""

from __future__ import annotations

import glob
import json
import os

import click

from hasfl_ray.cli.common import user_errors
from hasfl_ray.cli.main import main
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


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@user_errors
def report(paths, as_json) -> None:
    """Mean ± std over seeds of best/final accuracy and avg p per (dataset, algorithm), and the confound
    correlations of Table 5 per run. PATHS are run directories or folders holding them."""
    from hasfl_ray.analysis import confound_correlations, summarise_runs

    runs = find_runs(paths)
    table = summarise_runs(runs)
    confound = [{"run": r["path"], **confound_correlations(r)} for r in runs if confound_correlations(r)]
    if as_json:
        click.echo(json.dumps({"table": table, "confound": confound}, indent=2))
        return
    click.echo(f"{'dataset':<12} {'algorithm':<22} {'seeds':>5} {'best':>13} {'final':>13} {'avg p':>6}")
    for row in table:
        click.echo(f"{row['dataset']:<12} {row['algorithm']:<22} {len(row['seeds']):>5} "
                   f"{row['best_mean']:>6.1f} ± {row['best_std']:<4.1f} {row['final_mean']:>6.1f} ± "
                   f"{row['final_std']:<4.1f} {row['avg_p']:>6.2f}")
    if confound:
        click.echo("\nconfound (Table 5): r(H, p_max)  r(H, TV | p_max)  r(p, TV | p_max)")
        for row in confound:
            click.echo(f"  {row['r_h_pmax']:+.2f}  {row['r_h_tv_given_pmax']:+.2f}  {row['r_p_tv_given_pmax']:+.2f}"
                       f"  {row['run']}")


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--out", "out_dir", default="figures", show_default=True, help="Folder for the PNG files.")
@user_errors
def plot(paths, out_dir) -> None:
    """The paper's figures per dataset: convergence, mean H̃ and p per round, per-client p against p max,
    and the accuracy-capacity frontier. PATHS are run directories or folders holding them."""
    from hasfl_ray.analysis.plots import plot_runs

    for path in plot_runs(find_runs(paths), out_dir):
        click.echo(path)
