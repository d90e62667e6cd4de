"""`hasfl-ray report`: the paper's tables from finished run directories."""

from __future__ import annotations

import json
import os

import click

from hasfl_ray.cli.common import user_errors
from hasfl_ray.errors import ConfigError, DataError, OutputError


def run_directories(paths, started=None):
    """The run directories under PATHS (each one, or folders holding them at any depth), each run once however
    many paths reach it: the same real path through a link, a link loop or overlapping PATHS counts once. Links
    are followed, but only after every folder reached without one (so a run keeps the name it has without a link)
    and each real folder is entered once (so a loop ends). Order: by PATH, then by name under it. ``started``, a
    list, receives (in the same order) the run directories that hold config.yaml but no summary.json: runs
    stopped, failed or still running."""
    found = {}  # real path -> (index of the PATH that reached it, the name it was reached by)
    unfinished = {}
    entered = set()
    pending = [(top, index) for index, top in reversed(list(enumerate(paths)))]
    through_links = []  # folders reached through a link wait until everything else is walked
    while pending or through_links:
        folder, index = pending.pop() if pending else through_links.pop()
        real = os.path.realpath(folder)
        if real in entered:
            continue
        entered.add(real)
        if os.path.lexists(os.path.join(folder, "summary.json")):
            found[real] = (index, folder)
        elif os.path.lexists(os.path.join(folder, "config.yaml")):
            unfinished[real] = (index, folder)
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name, reverse=True)
        except OSError:
            continue  # not a folder, or one that cannot be listed (glob skipped these too)
        for entry in entries:
            if not entry.name.startswith(".") and _is_folder(entry):
                (through_links if entry.is_symlink() else pending).append((entry.path, index))
    if started is not None:
        started.extend(folder for _, folder in sorted(unfinished.values()))
    return [folder for _, folder in sorted(found.values())]


def _is_folder(entry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def find_runs(paths):
    """Finished runs under PATHS (see :func:`run_directories`), read; one sentence if none."""
    from hasfl_ray.analysis import read_run

    for path in paths:  # a mistyped PATH beside others was walked as an empty one: its runs left out without a word
        if not os.path.isdir(path):
            what = "does not exist" if not os.path.lexists(path) else "is not a folder"
            raise ConfigError(f"PATH {path!r} {what}; expected a run directory, a folder holding them or a sweep's "
                              "folder")
    started = []
    run_dirs = run_directories(paths, started)
    if not run_dirs:
        count = len(started)
        unfinished = (f" ({count} run director{'y holds' if count == 1 else 'ies hold'} config.yaml but no summary.json"
                      f", stopped, failed or still running: {', '.join(started)})") if started else ""
        raise ConfigError(f"no finished runs under {', '.join(paths)}{unfinished}; expected run directories holding "
                          "summary.json")
    return [read_run(path) for path in run_dirs]


def sweep_description(paths):
    """sweep.json of the first PATH that is a sweep's folder (its algorithm order and what it reproduces), or {};
    one sentence when that sweep.json is not what a sweep writes."""
    from hasfl_ray.files import read_json

    for path in paths:
        file = os.path.join(path, "sweep.json")
        if not os.path.lexists(file):
            continue
        data = read_json(file, "sweep file", "the sweep.json hasfl-ray sweep writes")
        if not isinstance(data, dict):
            raise DataError(f"sweep file {file!r} is a JSON {type(data).__name__}, not an object; expected the "
                            "sweep.json hasfl-ray sweep writes")
        algorithms, reproduces = data.get("algorithms") or [], data.get("reproduces") or ""
        if not (isinstance(algorithms, list) and all(isinstance(a, str) for a in algorithms)):
            raise DataError(f"sweep file {file!r} has algorithms {algorithms!r}; expected a list of names")
        if not isinstance(reproduces, str):
            raise DataError(f"sweep file {file!r} has reproduces {reproduces!r}; expected text")
        return data
    return {}


def unfinished_cells(paths, sweep, runs):
    """The cells of the sweep whose sweep.json :func:`sweep_description` read that hold no finished run (no
    summary.json in ``<sweep folder>/<cell name>``, whatever status sweep.json last recorded): [(name, status)]."""
    cells = sweep.get("cells") if isinstance(sweep, dict) else None
    if not isinstance(cells, list):
        return []
    root = next(path for path in paths if os.path.lexists(os.path.join(path, "sweep.json")))
    finished = {os.path.realpath(run["path"]) for run in runs}
    unfinished = []
    for cell in cells:
        name = cell.get("name") if isinstance(cell, dict) else None
        if isinstance(name, str) and name and os.path.realpath(os.path.join(root, name)) not in finished:
            unfinished.append((name, str(cell.get("status") or "pending")))
    return unfinished


def unfinished_runs(paths, sweep, cells):
    """The run directories under PATHS that a run started (config.yaml) and did not finish (no summary.json), other
    than the sweep's cells already named (``cells``, :func:`unfinished_cells`): [(path, "no summary.json")]."""
    started = []
    run_directories(paths, started)
    if not started:
        return []
    named = set()
    if cells:
        root = next(path for path in paths if os.path.lexists(os.path.join(path, "sweep.json")))
        named = {os.path.realpath(os.path.join(root, name)) for name, _ in cells}
    return [(folder, "no summary.json") for folder in started if os.path.realpath(folder) not in named]


def unfinished_runs_line(unfinished):
    """"unfinished: 1 run directory holds config.yaml but no summary.json (...): runs/a"."""
    count = len(unfinished)
    return (f"unfinished: {count} run director{'y holds' if count == 1 else 'ies hold'} config.yaml but no "
            "summary.json (stopped, failed or still running), so the tables and figures leave "
            f"{'it' if count == 1 else 'them'} out: {', '.join(path for path, _ in unfinished)}")


def unfinished_note(paths, sweep, runs):
    """What report and plot say of the runs they leave out: the sweep's cells without a result
    (:func:`unfinished_cells`) and the other run directories without their summary.json (:func:`unfinished_runs`),
    as (the lines, [(name, status)])."""
    cells = unfinished_cells(paths, sweep, runs)  # a sweep stopped early: said, never silently left out
    started = unfinished_runs(paths, sweep, cells)  # so is a run directory without its summary
    note = "\n".join(([unfinished_line(cells, len(sweep["cells"]))] if cells else [])
                     + ([unfinished_runs_line(started)] if started else []))
    return note, cells + started


def unfinished_line(unfinished, total):
    """"unfinished: 4 of 6 cells of the sweep have no result, so the tables leave them out: a (interrupted), ..."."""
    named = ", ".join(f"{name} ({status})" for name, status in unfinished)
    return (f"unfinished: {len(unfinished)} of {total} cells of the sweep have no result, so the tables and "
            f"figures leave them out: {named}")


def check_out(out_dir):
    """One sentence (exit 2) unless --out is a folder the files can be written into, or a path where one can be
    made (not a file, a device, /proc or a read-only place), and is missing, empty or one hasfl-ray made for a
    report's files (its mark): a folder of the user's files is never written into."""
    from hasfl_ray.engine.rundir import check_output_folder

    check_output_folder(out_dir, "report", "output folder", "choose another --out")


def write_files(write, out_dir):
    """``write()``'s paths, into --out made (if missing) and marked as hasfl-ray's report folder first (so the
    next report or plot may write it again); a write that fails after --out was checked (a full disk) is one
    sentence, exit 1."""
    from hasfl_ray.files import claim_folder

    try:
        claim = claim_folder(out_dir, "report")
        try:
            return write()
        except ConfigError:  # a run's file refused as it is read, before anything is written: nothing stays
            claim.undo()
            raise
    except OSError as error:
        raise OutputError(f"output folder {out_dir!r} could not be written ({error.strerror or type(error).__name__}"
                          "); the files written before it are complete, the others were not written") from None


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--out", "out_dir", type=click.Path(),
              help="Write table.{md,csv,tex}, widths/local/fairness.{md,csv,tex} (where runs record them), "
                   "clock.{md,csv,tex} and league.{md,csv,tex} (runs with a device clock), "
                   "confound.{md,csv,tex}, analysis.json and the figures (--format) here (default for a sweep's "
                   "folder: PATH/report): a new or empty folder, marked as hasfl-ray's, or one hasfl-ray marked; a "
                   "folder of other files is refused.")
@click.option("--budget-seconds", type=float, default=None,
              help="The league's time budget in simulated seconds: each run's accuracies as held then (default: "
                   "the smallest whole run's simulated time of the dataset's clocked runs, so every run reached it).")
@click.option("--budget-bytes", type=float, default=None,
              help="The league's data budget in bytes moved (down and up): each run's accuracies as held then "
                   "(default: the smallest whole run's bytes of the dataset's clocked runs).")
@click.option("--format", "fmt", type=click.Choice(["png", "pdf", "svg"]), default="png", show_default=True,
              help="The figures' format: png, or pdf or svg (vector, for a paper).")
@user_errors
def report(paths, as_json, out_dir, budget_seconds, budget_bytes, fmt) -> None:
    """Mean ± std over seeds of best/final accuracy, peak-to-final change and avg p per (dataset, algorithm), and
    the confound correlations of Table 5 per run. Runs that record them add accuracy at each width, global against
    local accuracy and fairness over clients (docs/metrics.md); a table no run records is left out with a line
    saying why. Runs with a device clock add the simulated time and data to each accuracy target and accuracy
    against simulated time and data moved (docs/clock.md), and the sub-model league: per method and cell (partition,
    width ladder) global, per-width and local accuracy at equal rounds, at equal simulated time and at equal bytes
    (time and bytes to 50 and 70 %, accuracy at --budget-seconds and --budget-bytes). PATHS are run directories, folders holding them, or a
    sweep's folder (then the files and figures are written too)."""
    from hasfl_ray.analysis import analyze_runs, summarise_runs
    from hasfl_ray.analysis.clocked import clock_markdown, clock_table
    from hasfl_ray.analysis.league import league_table
    from hasfl_ray.analysis.tables.league import league_markdown
    from hasfl_ray.analysis.report import grid_markdown, omitted_lines, width_tables
    from hasfl_ray.analysis.tables.layout import spread
    from hasfl_ray.analysis.write import write_report

    runs = find_runs(paths)
    sweep = sweep_description(paths)
    order = sweep.get("algorithms") or ()
    table = summarise_runs(runs, order)
    analysis = analyze_runs(runs)
    confound = analysis["runs"]
    tables = width_tables(runs, order)
    clock = clock_table(runs, order)  # None unless some run has a device clock (docs/clock.md)
    league = league_table(runs, order, budget_seconds, budget_bytes)  # None likewise (issue 44 item 4)
    if out_dir is None and sweep and len(paths) == 1:
        out_dir = os.path.join(paths[0], "report")
    if out_dir is not None:
        check_out(out_dir)
    note, unfinished = unfinished_note(paths, sweep, runs)
    written = write_files(lambda: write_report(runs, out_dir, order, sweep.get("reproduces") or "", budget_seconds,
                                               budget_bytes, note, fmt), out_dir) \
        if out_dir is not None else []
    if as_json:
        click.echo(json.dumps({"table": table, "confound": confound, "pooled": analysis["pooled"],
                               **{t["name"]: t["rows"] for t in tables if "rows" in t},
                               **({"clock": clock["rows"]} if clock is not None else {}),
                               **({"league": {"rows": league["rows"], "budgets": league["budgets"]}}
                                  if league is not None else {}),
                               "omitted": omitted_lines(tables), "files": written,
                               "unfinished": [{"name": name, "status": status} for name, status in unfinished]},
                              indent=2))
        return
    if note:
        click.echo(note)
    click.echo(f"{'dataset':<12} {'algorithm':<22} {'seeds':>5} {'best':>13} {'final':>13} {'peak->final':>11} "
               f"{'avg p':>6}")
    for row in table:  # one seed: the value alone (its spread was not measured)
        seeds = len(row["seeds"])
        click.echo(f"{row['dataset']:<12} {row['algorithm']:<22} {seeds:>5} "
                   f"{spread(row['best_mean'], row['best_std'], seeds):>13} "
                   f"{spread(row['final_mean'], row['final_std'], seeds):>13} {row['peak_to_final']:>+11.1f} "
                   f"{row['avg_p']:>6.2f}")
    for extra in tables:
        if "rows" in extra:
            click.echo(f"\n{extra['title']}:\n{grid_markdown(extra).rstrip()}")
    for line in omitted_lines(tables):
        click.echo(line)
    if clock is not None:
        click.echo(f"\n{clock['title']}:\n{clock_markdown(clock).rstrip()}")
    if league is not None:
        click.echo("\n" + league_markdown(league).rstrip())
    if confound:
        _echo_confound(analysis)
    for path in written:
        click.echo(f"wrote {path}")


#: The confound table's statistics: (summary key, column title).
CONFOUND_STATISTICS = (("r_h_tv", "r(H, TV)"), ("r_h_pmax", "r(H, p_max)"), ("r_h_tv_given_pmax", "r(H, TV | p_max)"),
                       ("r_p_tv_given_pmax", "r(p, TV | p_max)"))


def _fmt(row, key):
    r, pvalue = row.get(key), row.get("pvalue_" + key[2:])
    if r is None:
        return "n/a"
    return f"{r:+.2f} (p={pvalue:.2g})" if pvalue is not None else f"{r:+.2f}"


def _echo_confound(analysis) -> None:
    """The confound table: a row per run and per (dataset, algorithm) pooled over seeds, each column (the label
    included) as wide as its widest cell, so the columns line up whatever the names and p-values."""
    rows = [(f"{row['dataset']}/{row['algorithm']}/s{row['seed']}", row, row["run"]) for row in analysis["runs"]]
    rows += [(f"{row['dataset']}/{row['algorithm']}/pooled", row, f"seeds {', '.join(str(s) for s in row['seeds'])}")
             for row in analysis["pooled"] if row.get("n_clients")]
    title = "confound (Table 5):"
    table = [[label, str(row["n_clients"])] + [_fmt(row, key) for key, _ in CONFOUND_STATISTICS]
             for label, row, _ in rows]
    header = ["", "n"] + [name for _, name in CONFOUND_STATISTICS]
    widths = [max(len(cells[i]) for cells in [header] + table) for i in range(len(header))]
    widths[0] = max(widths[0], len(title) - 2)
    click.echo(f"\n{title:<{widths[0] + 2}} " + " ".join(f"{name:>{w}}" for name, w in zip(header[1:], widths[1:])))
    for cells, (_, _, tail) in zip(table, rows):
        click.echo(f"  {cells[0]:<{widths[0]}} " + " ".join(f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:]))
                   + f"  {tail}")
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
    from hasfl_ray.engine.rundir import check_run_directory

    found = find_runs(runs)
    analysis = analyze_runs(found)
    if not analysis["runs"]:
        raise ConfigError(f"no run under {', '.join(runs)} has H̃ estimates (h_tilde in clients.csv); expected "
                          "hasfl runs with at least 4 clients")
    for row in analysis["runs"]:  # each gets its block in summary.json: all writable, or nothing written
        check_run_directory(row["run"], fix="analyze writes into summary.json: analyze a writable copy")
    if as_json:
        click.echo(json.dumps(analysis, indent=2))
    else:
        _echo_confound(analysis)
        for row in analysis["runs"]:
            click.echo(f"verdict, {row['run']}: {row['verdict']}")
    for run in found:
        write_analysis(run)


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--out", "out_dir", default="figures", show_default=True,
              help="Folder for the figures (--format): a new or empty folder, marked as hasfl-ray's, or one hasfl-ray "
                   "marked (a report's too); a folder of other files is refused.")
@click.option("--format", "fmt", type=click.Choice(["png", "pdf", "svg"]), default="png", show_default=True,
              help="The figures' format: png, or pdf or svg (vector, for a paper).")
@user_errors
def plot(paths, out_dir, fmt) -> None:
    """The paper's figures per dataset: convergence, mean H̃ and p per round, per-client p against p max,
    and the accuracy-capacity frontier (and accuracy against simulated time and data moved for runs with a device
    clock, docs/clock.md). PATHS are run directories or folders holding them; the runs left out (a sweep's
    unfinished cells, run directories without summary.json) are named on stderr, as report names them."""
    from hasfl_ray.analysis.plots import plot_runs

    runs = find_runs(paths)
    sweep = sweep_description(paths)
    order = sweep.get("algorithms") or ()  # a sweep's: its lines in its tables' order
    check_out(out_dir)
    note, _ = unfinished_note(paths, sweep, runs)  # the runs the figures leave out, named as report names them
    written = write_files(lambda: plot_runs(runs, out_dir, order, fmt), out_dir)
    if note:  # on stderr: stdout stays the list of the figures' paths
        click.echo(note, err=True)
    for path in written:
        click.echo(path)
