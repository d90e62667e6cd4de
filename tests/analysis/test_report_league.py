"""`hasfl-ray report`'s sub-model league (issue 44 item 4) on real runs made with the CLI (digits, 3 rounds, the
seeded lognormal device clock): every number is checked against the run's own metrics.jsonl and summary.json."""

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

SMALL = ["--backend", "local", "--rounds", "3", "--clients", "6", "--clients-per-round", "3", "--quiet"]
CLOCK = ["--devices", "lognormal", "--local-eval-every", "1"]
#: (folder, algorithm, seed, extra flags): HeteroFL two seeds and FedRolex one on the clock (Dirichlet 0.3, the
#: digits' tiers); HeteroFL on an IID partition (another cell); Uniform without a clock.
RUNS = (("digits-heterofl-seed1", "heterofl", 1, CLOCK), ("digits-heterofl-seed2", "heterofl", 2, CLOCK),
        ("digits-fedrolex-seed1", "fedrolex", 1, CLOCK),
        ("digits-heterofl-iid-seed1", "heterofl", 1, CLOCK + ["--partition", "iid"]),
        ("digits-uniform-seed1", "uniform", 1, []))


@pytest.fixture(scope="module")
def league(tmp_path_factory):
    """The runs' folder."""
    root = tmp_path_factory.mktemp("league") / "runs"
    for folder, algorithm, seed, extra in RUNS:
        result = CliRunner().invoke(main, ["simulate", *SMALL, "--algorithm", algorithm, "--seed", str(seed),
                                           "--out", str(root / folder), *extra])
        assert result.exit_code == 0, result.output
    return root


def lines(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summary(run):
    return json.loads((run / "summary.json").read_text())


def report(*args):
    return CliRunner().invoke(main, ["report", *map(str, args)])


def rows_of(result):
    assert result.exit_code == 0, result.output
    return {(row["partition"], row["algorithm"]): row for row in json.loads(result.output)["league"]["rows"]}


def first_reached(run, target):
    """(sim_time_s, cumulative bytes) at the first line whose test_accuracy >= target, read from the file here."""
    moved = 0
    for line in lines(run):
        moved += line["bytes_down"] + line["bytes_up"]
        if line["test_accuracy"] is not None and line["test_accuracy"] >= target:
            return line["sim_time_s"], moved
    return None


def held(run, budget, axis):
    """The metrics line of the last round finished by ``budget`` seconds (axis 0) or bytes (1)."""
    moved, last = 0, None
    for line in lines(run):
        moved += line["bytes_down"] + line["bytes_up"]
        if (line["sim_time_s"], moved)[axis] <= budget:
            last = line
    return last


def expected_cell(values, scale=1.0):
    numbers = [scale * v for v in values if v is not None]
    if not numbers:
        return None
    return pytest.approx(np.mean(numbers)), pytest.approx(np.std(numbers, ddof=1) if len(numbers) > 1 else 0.0), \
        len(numbers)


def check(cell, expected):
    if expected is None:
        assert isinstance(cell, str), cell
    else:
        assert (cell["mean"], cell["std"], cell["n"]) == expected


SEEDS = {("Dir(0.3)", "heterofl"): ["digits-heterofl-seed1", "digits-heterofl-seed2"],
         ("Dir(0.3)", "fedrolex"): ["digits-fedrolex-seed1"], ("IID", "heterofl"): ["digits-heterofl-iid-seed1"]}


def test_time_and_bytes_to_50_and_70_percent_are_the_first_rounds_reaching_them(league):
    rows = rows_of(report(league, "--json"))
    assert set(rows) == set(SEEDS) | {("Dir(0.3)", "uniform")}  # the IID run is a cell of its own
    reached = 0
    for key, folders in SEEDS.items():
        cells = rows[key]["cells"]
        for target in ("0.5", "0.7"):
            hits = [first_reached(league / f, float(target)) for f in folders]
            reached += sum(h is not None for h in hits)
            check(cells[f"time_to_{target}_s"], expected_cell([h and h[0] for h in hits]))
            check(cells[f"bytes_to_{target}"], expected_cell([h and h[1] for h in hits]))
    assert reached > 0  # some run reached 50 %: the comparison above is not only of "not reached"


def test_equal_rounds_are_each_runs_final_summary(league):
    rows = rows_of(report(league, "--json"))
    for key, folders in SEEDS.items():
        cells, summaries = rows[key]["cells"], [summary(league / f) for f in folders]
        check(cells["global"], expected_cell([s["final_accuracy"] for s in summaries], 100))
        for width in summaries[0]["accuracy_at_width_final"]:
            check(cells[f"p={width}"], expected_cell([s["accuracy_at_width_final"][width] for s in summaries], 100))
        for name in ("mean", "worst"):
            check(cells[f"local_{name}"], expected_cell([s["local_accuracy"][name] for s in summaries], 100))


@pytest.mark.parametrize("axis, kind, flag", [(0, "time", "--budget-seconds"), (1, "bytes", "--budget-bytes")])
def test_accuracy_at_a_budget_is_what_the_server_held_then(league, axis, kind, flag):
    """A budget of 60 % of the shortest clocked run: each run scored at its last round finished by then."""
    folders = [f for group in SEEDS.values() for f in group]
    total = min(lines(league / f)[-1]["sim_time_s"] if axis == 0 else
                sum(line["bytes_down"] + line["bytes_up"] for line in lines(league / f)) for f in folders)
    budget = 0.6 * total
    rows = rows_of(report(league, "--json", flag, budget))
    scored = 0
    for key, folders in SEEDS.items():
        cells, then = rows[key]["cells"], [held(league / f, budget, axis) for f in folders]
        scored += sum(line is not None for line in then)
        check(cells[f"global@{kind}"], expected_cell([line and line["test_accuracy"] for line in then], 100))
        for width in summary(league / folders[0])["accuracy_at_width_final"]:
            check(cells[f"p={width}@{kind}"],
                  expected_cell([line and line["accuracy_at_width"][width] for line in then], 100))
        for name in ("mean", "worst"):  # metrics.jsonl's local_accuracy_mean and _worst (--local-eval-every 1)
            check(cells[f"local_{name}@{kind}"],
                  expected_cell([line and line[f"local_accuracy_{name}"] for line in then], 100))
    assert scored > 0  # some run had finished a round by the budget
    assert rows[("Dir(0.3)", "uniform")]["cells"][f"global@{kind}"] == "no clock"


def test_the_default_budget_is_the_smallest_run_and_a_larger_one_says_who_ended_before(league):
    clocked = [league / f for folders in SEEDS.values() for f in folders]
    totals = {run: lines(run)[-1]["sim_time_s"] for run in clocked}
    shortest = min(totals, key=totals.get)
    result = report(league, "--json")
    budgets = json.loads(result.output)["league"]["budgets"]["digits"]
    assert budgets["time"] == pytest.approx(totals[shortest]) and budgets["time_given"] is False
    key = next(key for key, folders in SEEDS.items() if shortest.name in folders)
    row = rows_of(result)[key]
    values = [100 * summary(league / f)["final_accuracy"] if league / f == shortest else
              100 * held(league / f, totals[shortest], 0)["test_accuracy"] for f in SEEDS[key]]
    assert row["cells"]["global@time"]["mean"] == pytest.approx(np.mean(values))  # the shortest: its final accuracy
    beyond = max(totals.values()) * 2
    rows = rows_of(report(league, "--json", "--budget-seconds", beyond))
    assert rows[("Dir(0.3)", "fedrolex")]["cells"]["global@time"] == "ended before"


def test_the_report_writes_the_league_files_and_figure(league, tmp_path):
    out = tmp_path / "out"
    result = report(league, "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "digits-league.png").read_bytes()[:4] == b"\x89PNG"
    markdown = (out / "league.md").read_text()
    assert "## Digits, the dataset's tiers" in markdown and "### At equal simulated time (budget" in markdown
    fedrolex = next(line for line in markdown.splitlines() if line.startswith("| Dir(0.3) | FedRolex | 1 |"))
    assert "±" not in fedrolex  # one seed: no ± (the two-seed HeteroFL row has them)
    assert "±" in next(line for line in markdown.splitlines() if line.startswith("| Dir(0.3) | HeteroFL | 1, 2 |"))
    assert "no clock: Uniform (Dir(0.3)) ran without --devices" in markdown
    uniform = [line for line in markdown.splitlines() if line.startswith("| Dir(0.3) | Uniform |")]
    # its equal-rounds row has numbers; its time row says "no clock" in each cell: to 50/70 %, global, 4 widths, local
    assert len(uniform) == 3 and uniform[1].count("no clock") == 2 + 1 + 4 + 2 and "no clock" not in uniform[0]
    rows = {(r["partition"], r["algorithm"]): r for r in csv.DictReader(open(out / "league.csv"))}
    heterofl = summary(league / "digits-heterofl-iid-seed1")
    assert float(rows[("IID", "heterofl")]["global_mean"]) == pytest.approx(100 * heterofl["final_accuracy"])
    assert rows[("Dir(0.3)", "uniform")]["time_to_0.5_s_mean"] == "no clock"
    assert r"\toprule" in (out / "league.tex").read_text()


@pytest.mark.parametrize("args, message", [
    (["--budget-seconds", "-1"], "--budget-seconds is -1.0; expected a finite number > 0 (simulated seconds)"),
    (["--budget-bytes", "nan"], "--budget-bytes is nan; expected a finite number > 0 (bytes down and up)"),
])
def test_a_bad_budget_is_one_sentence_and_nothing_is_written(league, tmp_path, args, message):
    result = report(league, "--out", tmp_path / "out", *args)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_budget_without_any_clocked_run_is_refused_and_unclocked_reports_have_no_league(league):
    result = report(league / "digits-uniform-seed1", "--budget-seconds", "5")
    assert result.exit_code == 2 and "no run reported has a device clock" in result.output
    result = report(league / "digits-uniform-seed1", "--json")
    assert result.exit_code == 0 and "league" not in json.loads(result.output)


def test_a_run_made_before_the_worst_client_was_recorded_per_round_says_so(league, tmp_path):
    import shutil

    run = tmp_path / "runs" / "digits-fedrolex-seed1"
    shutil.copytree(league / "digits-fedrolex-seed1", run)
    old = [{k: v for k, v in line.items() if k != "local_accuracy_worst"} for line in lines(run)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in old))
    result = report(tmp_path / "runs", "--json")
    cells = rows_of(result)[("Dir(0.3)", "fedrolex")]["cells"]
    assert cells["local_worst@time"] == "not per round"  # not a number made up from the mean or the end
    assert cells["local_mean@time"]["mean"] == pytest.approx(100 * old[-1]["local_accuracy_mean"])
    assert cells["local_worst"]["mean"] == pytest.approx(100 * summary(run)["local_accuracy"]["worst"])


def test_the_report_prints_the_league_after_the_clock_table(league):
    result = report(league)
    assert result.exit_code == 0, result.output
    text = result.output
    assert text.index("Time and data to accuracy:") < text.index("# The sub-model league")
    assert "### At equal bytes (down and up) (budget" in text and "| IID | HeteroFL | 1 |" in text


def test_fedlases_global_accuracy_is_the_mean_over_the_last_20_rounds(league, tmp_path):
    """FedLASE's metric (its section 5): test accuracy averaged over the last 20 rounds. On a real 23-round clocked run
    that tests every 2nd round (and the last), the cell is the mean of the test accuracies its last 20 lines hold,
    rounds without one left out; on the 3-round runs, the mean over all their rounds."""
    run = tmp_path / "runs" / "digits-heterofl-seed1"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "23", "--clients", "4",
                                       "--clients-per-round", "2", "--quiet", "--algorithm", "heterofl", "--seed",
                                       "1", "--devices", "lognormal", "--test-every", "2", "--out", str(run)])
    assert result.exit_code == 0, result.output
    tested = [line["test_accuracy"] for line in lines(run)]
    assert len(tested) == 23 and None in tested[-20:]  # some of the last 20 rounds recorded none
    window = [a for a in tested[-20:] if a is not None]
    cell = rows_of(report(tmp_path / "runs", "--json"))[("Dir(0.3)", "heterofl")]["cells"]["global_last20"]
    assert (cell["mean"], cell["n"]) == (pytest.approx(100 * np.mean(window)), 1)
    earlier = [a for a in tested[:-20] if a is not None]
    assert earlier and np.mean(window) != pytest.approx(np.mean(window + earlier))  # the window is not the whole run
    rows = rows_of(report(league, "--json"))
    for key, folders in SEEDS.items():  # 3 rounds: all of them
        check(rows[key]["cells"]["global_last20"],
              expected_cell([np.mean([line["test_accuracy"] for line in lines(league / f)]) for f in folders], 100))
    markdown = report(league)
    assert "| Partition | Method | Seeds | Global (%) | Global, last 20 rounds (%) |" in markdown.output


def test_a_title_that_names_the_league_is_not_repeated_in_its_heading():
    """h61: a league config's ``reproduces`` begins with "The sub-model league", so league.md's heading read "# The
    sub-model league on CIFAR-10 (...): The sub-model league"; the title alone now, another title as before."""
    from hasfl_ray.analysis.tables.league import league_heading

    table = {"title": "The sub-model league"}
    assert league_heading(table, "The sub-model league on CIFAR-10 (FedLASE's grid)") == \
        "The sub-model league on CIFAR-10 (FedLASE's grid)"
    assert league_heading(table, "Table 3") == "Table 3: The sub-model league"
    assert league_heading(table) == "The sub-model league"


def test_a_sparse_test_cadence_is_named_under_the_league(league, tmp_path):
    """h65 (cost-f) left the league's time and bytes to 50 / 70 %: a run that tested every 3rd round dates a target to
    the first tested round after reaching it, which the caption now says (markdown, and the LaTeX captions of the
    time and bytes views); nothing is said where every run tested each round."""
    assert "--test-every" not in report(league).output
    runs = tmp_path / "runs"
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--algorithm", "heterofl", "--seed", "1", *CLOCK,
                                       "--test-every", "3", "--out", str(runs / "digits-heterofl-seed1")])
    assert result.exit_code == 0, result.output
    words = "test accuracy every 3 rounds in some runs (--test-every): their targets are dated to the first round"
    assert words in " ".join(report(runs).output.split())
    assert report(runs, "--out", tmp_path / "tables").exit_code == 0
    assert words in " ".join((tmp_path / "tables" / "league.md").read_text().split())
    captions = [line for line in (tmp_path / "tables" / "league.tex").read_text().splitlines()
                if line.startswith(r"\caption{")]
    assert captions and all(("test-every" in c) == ("At equal rounds" not in c) for c in captions)
