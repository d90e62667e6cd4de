"""`report` and `plot` on first use (issue 45 item 5): a sweep's unfinished cells are named (text, JSON, table.md),
a one-seed cell prints its value without "± 0.0", and the figures come as PNG, PDF or SVG (--format), the same bytes
each time."""

import json
import shutil

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    """Two real HAS-FL runs on the digits (seeds 1 and 2; 2 rounds, 6 clients)."""
    root = tmp_path_factory.mktemp("runs")
    for seed in (1, 2):
        Engine(RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3, seed=seed),
               out_dir=str(root / f"digits-hasfl-seed{seed}")).run()
    return root


def report(*args):
    return CliRunner().invoke(main, ["report", *map(str, args)])


def sweep_folder(two_seeds, tmp_path):
    """A sweep of four cells stopped early: two finished, one interrupted (a folder without summary.json), one that
    never started."""
    folder = tmp_path / "sweep"
    for seed in (1, 2):
        shutil.copytree(two_seeds / f"digits-hasfl-seed{seed}", folder / f"digits-hasfl-seed{seed}")
    (folder / "digits-fedavg-seed1").mkdir()
    cells = [{"name": "digits-hasfl-seed1", "status": "done"}, {"name": "digits-hasfl-seed2", "status": "done"},
             {"name": "digits-fedavg-seed1", "status": "interrupted"}, {"name": "digits-fedavg-seed2",
                                                                         "status": "pending"}]
    (folder / "sweep.json").write_text(json.dumps({"algorithms": ["hasfl", "fedavg"], "cells": cells}))
    return folder


def test_report_names_a_sweeps_unfinished_cells(two_seeds, tmp_path):
    folder = sweep_folder(two_seeds, tmp_path)
    result = report(folder, "--out", tmp_path / "tables")
    assert result.exit_code == 0, result.output
    line = ("unfinished: 2 of 4 cells of the sweep have no result, so the tables and figures leave them out: "
            "digits-fedavg-seed1 (interrupted), digits-fedavg-seed2 (pending)")
    assert line in result.output.splitlines()
    assert line in (tmp_path / "tables" / "table.md").read_text()
    data = json.loads(report(folder, "--json").output)
    assert data["unfinished"] == [{"name": "digits-fedavg-seed1", "status": "interrupted"},
                                  {"name": "digits-fedavg-seed2", "status": "pending"}]
    (folder / "sweep.json").write_text(json.dumps({"cells": [{"name": "digits-hasfl-seed1", "status": "done"}]}))
    finished = report(folder, "--json")
    assert json.loads(finished.output)["unfinished"] == [] and "unfinished" not in report(folder).output


def test_one_seed_prints_no_spread(two_seeds, tmp_path):
    result = report(two_seeds / "digits-hasfl-seed1", "--out", tmp_path / "one")
    assert result.exit_code == 0, result.output
    table = (tmp_path / "one" / "table.md").read_text()
    assert "±" not in table and "Accuracies: one seed: no spread." in table
    assert "±" not in result.output.split("confound")[0]
    assert r"\pm" not in (tmp_path / "one" / "table.tex").read_text()
    both = report(two_seeds, "--out", tmp_path / "two")
    assert both.exit_code == 0 and "±" in (tmp_path / "two" / "table.md").read_text()


@pytest.mark.parametrize("fmt, head", [("pdf", b"%PDF"), ("svg", b"<?xml")])
def test_figures_as_vector_files_the_same_bytes_each_time(two_seeds, tmp_path, fmt, head):
    result = report(two_seeds, "--out", tmp_path / "a", "--format", fmt)
    assert result.exit_code == 0, result.output
    figures = sorted(p.name for p in (tmp_path / "a").iterdir() if p.suffix in (".png", ".pdf", ".svg"))
    assert "digits-convergence." + fmt in figures and all(name.endswith("." + fmt) for name in figures)
    assert all((tmp_path / "a" / name).read_bytes().startswith(head) for name in figures)
    again = CliRunner().invoke(main, ["plot", str(two_seeds), "--out", str(tmp_path / "b"), "--format", fmt])
    assert again.exit_code == 0, again.output
    for name in figures:
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name


def test_a_format_not_offered_is_refused():
    result = CliRunner().invoke(main, ["plot", "runs", "--format", "jpg"])
    assert result.exit_code == 2 and "jpg" in result.output and "png" in result.output


def test_report_names_a_run_directory_without_its_summary(two_seeds, tmp_path):
    """A run directory that a run started (config.yaml) but never finished (no summary.json: stopped, failed or
    still running), named as a PATH or under a folder that is not a sweep's, was left out without a word: the
    seeds column showed one seed fewer and nothing said why. It is now named, as a sweep's unfinished cells are."""
    folder = tmp_path / "runs"
    shutil.copytree(two_seeds, folder)
    (folder / "digits-hasfl-seed2" / "summary.json").unlink()
    line = ("unfinished: 1 run directory holds config.yaml but no summary.json (stopped, failed or still running), "
            f"so the tables and figures leave it out: {folder / 'digits-hasfl-seed2'}")
    for paths in ([folder], [folder / "digits-hasfl-seed1", folder / "digits-hasfl-seed2"]):
        result = report(*paths, "--out", tmp_path / f"tables{len(paths)}")
        assert result.exit_code == 0, result.output
        assert line in result.output.splitlines()
        assert line in (tmp_path / f"tables{len(paths)}" / "table.md").read_text()
        data = json.loads(report(*paths, "--json").output)
        assert data["unfinished"] == [{"name": str(folder / "digits-hasfl-seed2"), "status": "no summary.json"}]
    assert "unfinished" not in report(two_seeds).output


def test_plot_names_the_runs_its_figures_leave_out(two_seeds, tmp_path):
    """plot drew the figures of the finished runs and said nothing of a sweep's unfinished cells or of a run
    directory without its summary.json (report named them, 94babb2): they are now named in report's words (on
    stderr: stdout stays the figures' paths), and with no finished run at all the refusal names the unfinished."""
    folder = sweep_folder(two_seeds, tmp_path)
    shutil.copytree(two_seeds / "digits-hasfl-seed1", folder / "extra" / "digits-uniform-seed1")
    (folder / "digits-fedavg-seed1" / "config.yaml").write_text("algorithm: fedavg\n")  # an interrupted cell's
    (folder / "extra" / "digits-uniform-seed1" / "summary.json").unlink()
    plotted = CliRunner().invoke(main, ["plot", str(folder), "--out", str(tmp_path / "figures")])
    assert plotted.exit_code == 0, plotted.output
    cells = ("unfinished: 2 of 4 cells of the sweep have no result, so the tables and figures leave them out: "
             "digits-fedavg-seed1 (interrupted), digits-fedavg-seed2 (pending)")
    started = ("unfinished: 1 run directory holds config.yaml but no summary.json (stopped, failed or still running), "
               f"so the tables and figures leave it out: {folder / 'extra' / 'digits-uniform-seed1'}")
    assert plotted.stderr.splitlines() == [cells, started]
    assert plotted.stdout.splitlines() and all(line.startswith(str(tmp_path / "figures"))
                                               for line in plotted.stdout.splitlines())
    assert report(folder, "--out", tmp_path / "tables").output.splitlines()[:2] == [cells, started]
    clean = CliRunner().invoke(main, ["plot", str(two_seeds), "--out", str(tmp_path / "clean")])
    assert clean.exit_code == 0 and clean.stderr == ""
    for command in ("plot", "report"):
        nothing = CliRunner().invoke(main, [command, str(folder / "extra"), "--out", str(tmp_path / f"no-{command}")])
        assert nothing.exit_code == 2 and "Traceback" not in nothing.output
        assert nothing.output.strip() == (
            f"Error: no finished runs under {folder / 'extra'} (1 run directory holds config.yaml but no "
            f"summary.json, stopped, failed or still running: {folder / 'extra' / 'digits-uniform-seed1'}); "
            "expected run directories holding summary.json")


@pytest.mark.parametrize("command", ["report", "plot", "analyze"])
def test_a_path_that_is_missing_or_a_file_beside_others_is_refused(two_seeds, tmp_path, command):
    """`report runs/sweep-a runs/sweep-b` with the second mistyped (or a file: a summary.json named itself) reported
    the first alone, exit 0, without a word of the PATH it walked as an empty folder: each PATH must now be a
    folder, or the command says which one is not (exit 2, nothing written)."""
    (tmp_path / "notes.txt").write_text("not runs\n")
    for path, what in ((tmp_path / "mistyped", "does not exist"), (tmp_path / "notes.txt", "is not a folder"),
                       (two_seeds / "digits-hasfl-seed1" / "summary.json", "is not a folder")):
        args = [command, str(two_seeds), str(path)] + (["--out", str(tmp_path / "out")] if command != "analyze" else [])
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert result.output.strip() == (f"Error: PATH {str(path)!r} {what}; expected a run directory, a folder "
                                          "holding them or a sweep's folder")
        assert not (tmp_path / "out").exists()
