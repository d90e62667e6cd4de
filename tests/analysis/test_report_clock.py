"""`hasfl-ray report` on the device clock (issue 26 item 6): time and data to accuracy per algorithm, accuracy
against simulated time and data moved; run directories written by hand here, so the expected numbers are known."""

import csv
import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.analysis.clocked import _step_curves, clock_table
from hasfl_ray.analysis.report import read_run
from hasfl_ray.cli.main import main

DEVICES = {"distribution": "lognormal", "speed_median": 2.0e9}


def make_run(path, seed, accuracies, algorithm="hasfl", round_time=2.0, round_bytes=1_000_000, clocked=True,
             metrics=True):
    """A finished run: round t ends at (t + 1) x ``round_time`` simulated seconds and moves ``round_bytes`` bytes
    (60 % down, 40 % up) with test accuracy ``accuracies[t]``."""
    path.mkdir(parents=True)
    config = {"dataset": "digits", "algorithm": algorithm, "seed": seed, "devices": DEVICES if clocked else None,
              "deadline": 3.0 if clocked else None, "deadline_policy": "drop"}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "summary.json").write_text(json.dumps({"best_accuracy": max(accuracies), "final_accuracy": accuracies[-1],
                                                   "avg_p": 0.5, "rounds": len(accuracies)}))
    with open(path / "clients.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["client", "num_samples", "p_max", "tv_distance", "h_tilde",
                                                    "p_final"])
        writer.writeheader()
        for i in range(4):
            writer.writerow({"client": i, "num_samples": 10, "p_max": 0.5, "tv_distance": 0.1, "h_tilde": "",
                             "p_final": 0.5})
    if metrics:
        lines = []
        for t, accuracy in enumerate(accuracies):
            line = {"round": t, "test_accuracy": accuracy, "test_loss": 1.0, "avg_p": 0.5, "mean_h": None}
            if clocked:
                line.update(sim_time_s=(t + 1) * round_time, round_time_s=round_time, bytes_down=round_bytes * 3 // 5,
                            bytes_up=round_bytes * 2 // 5)
            lines.append(json.dumps(line) + "\n")
        (path / "metrics.jsonl").write_text("".join(lines))
    return path


def sweep(tmp_path):
    """HAS-FL: seeds 1 and 2 reach 95 % at rounds 3 and 4 (6 and 8 s), seed 3 never; Uniform never (80 % at
    round 2 of rounds of 1 s and 0.5 MB)."""
    runs = tmp_path / "runs"
    make_run(runs / "digits-hasfl-seed1", 1, [0.4, 0.85, 0.9, 0.96, 0.97])
    make_run(runs / "digits-hasfl-seed2", 2, [0.5, 0.8, 0.91, 0.93, 0.95])
    make_run(runs / "digits-hasfl-seed3", 3, [0.3, 0.6, 0.82, 0.9, 0.92])
    make_run(runs / "digits-uniform-seed1", 1, [0.6, 0.8, 0.85], algorithm="uniform", round_time=1.0,
             round_bytes=500_000)
    return runs


def report(*args):
    return CliRunner().invoke(main, ["report", *map(str, args)])


def test_time_and_bytes_to_accuracy_are_mean_and_std_over_the_seeds_that_reached_it(tmp_path):
    result = report(sweep(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    rows = {row["algorithm"]: row for row in json.loads(result.output)["clock"]}
    hasfl, uniform = rows["hasfl"]["cells"], rows["uniform"]["cells"]
    assert rows["hasfl"]["seeds"] == [1, 2, 3]
    # 95 %: seed 1 at round 3 (8 s, 4 MB), seed 2 at round 4 (10 s, 5 MB); seed 3 never
    assert hasfl["time_to_0.95_s"] == {"mean": 9.0, "std": pytest.approx(np.std([8, 10], ddof=1)), "n": 2}
    assert hasfl["bytes_to_0.95"] == {"mean": 4.5e6, "std": pytest.approx(np.std([4e6, 5e6], ddof=1)), "n": 2}
    # 80 %: rounds 1, 1, 2 (4, 4, 6 s)
    assert hasfl["time_to_0.8_s"]["mean"] == pytest.approx(14 / 3) and hasfl["time_to_0.8_s"]["n"] == 3
    assert hasfl["sim_time_s"]["mean"] == 10.0 and hasfl["bytes"]["mean"] == 5e6
    assert uniform["time_to_0.5_s"] == {"mean": 1.0, "std": 0.0, "n": 1}
    assert uniform["time_to_0.8_s"]["mean"] == 2.0 and uniform["bytes_to_0.8"]["mean"] == 1e6
    assert uniform["time_to_0.9_s"] == uniform["bytes_to_0.95"] == "not reached"


def test_report_writes_the_clock_table_and_figure(tmp_path):
    runs = sweep(tmp_path)
    result = report(runs, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    names = {p.name for p in out.iterdir()}
    assert {"clock.md", "clock.csv", "clock.tex", "digits-clock.png"} <= names
    assert (out / "digits-clock.png").read_bytes()[:4] == b"\x89PNG"
    markdown = (out / "clock.md").read_text()
    assert "| Time to 95 % (s) | Data to 95 % (MB) |" in markdown
    # HAS-FL at 95 %: 9.00 ± 1.41 s and 4.50 ± 0.71 MB, reached by 2 of 3 seeds; Uniform: not reached
    assert "| Digits | HAS-FL | 1, 2, 3 | 3.33 ± 1.15 | 1.67 ± 0.58 |" in markdown  # 50 %: 2, 4, 4 s
    assert "9.00 ± 1.41 (2/3 reached) | 4.50 ± 0.71 (2/3 reached) |" in markdown
    uniform = "| Digits | Uniform | 1 | 1.00 | 0.500 | 2.00 | 1.00 | not reached |"  # one seed: no ± (issue 45)
    assert uniform in markdown
    assert "lognormal devices, deadline 3 s (drop)" in markdown
    rows = {r["algorithm"]: r for r in csv.DictReader(open(out / "clock.csv"))}  # raw seconds and bytes
    assert float(rows["hasfl"]["time_to_0.95_s_mean"]) == 9.0 and rows["hasfl"]["time_to_0.95_s_seeds"] == "2"
    assert float(rows["hasfl"]["bytes_to_0.95_mean"]) == 4.5e6
    assert rows["uniform"]["time_to_0.95_s_mean"] == "not reached" and rows["uniform"]["time_to_0.95_s_std"] == ""
    tex = (out / "clock.tex").read_text()
    assert r"Time to 95\% (s)" in tex and r"9.00 $\pm$ 1.41 (2/3 reached)" in tex and r"\toprule" in tex


def test_units_follow_the_largest_value(tmp_path):
    """A unit is taken once the largest time or data to a target reached is ten of it (else a whole run's)."""
    make_run(tmp_path / "a", 1, [0.5, 0.96], round_time=20000.0, round_bytes=5_000_000_000)
    table = clock_table([read_run(str(tmp_path / "a"))])
    assert table["units"] == {"time": (3600.0, "h"), "bytes": (1e9, "GB")}  # 40,000 s and 10 GB to 95 %
    assert "Time to 95 % (h)" in [header for _, header, _, _ in table["columns"]]
    make_run(tmp_path / "b", 1, [0.5, 0.6], round_time=20000.0, round_bytes=4_000_000_000)
    table = clock_table([read_run(str(tmp_path / "b"))])
    assert table["units"] == {"time": (60.0, "min"), "bytes": (1e6, "MB")}  # 50 % at 20,000 s and 4 GB


def test_runs_without_a_clock_leave_the_report_as_it_was(tmp_path):
    """No clock table, no clock figure, no line saying one was left out; and their metrics.jsonl is not read."""
    runs = tmp_path / "runs"
    make_run(runs / "a", 1, [0.5, 0.9], clocked=False)
    make_run(runs / "b", 2, [0.6, 0.8], clocked=False)
    result = report(runs, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert not {n for n in names if "clock" in n} and "Time and data" not in result.output
    assert "clock" not in (tmp_path / "out" / "table.md").read_text()
    make_run(tmp_path / "bare" / "c", 3, [0.5, 0.9], clocked=False, metrics=False)
    result = report(tmp_path / "bare", "--json")
    assert result.exit_code == 0, result.output
    assert "clock" not in json.loads(result.output)


@pytest.mark.parametrize("change, message", [
    (lambda line: line.update(sim_time_s="soon"), "has sim_time_s 'soon'; expected a finite number >= 0 or null"),
    (lambda line: line.pop("bytes_up"), "has bytes_up None; expected a number on every line of a clocked run"),
])
def test_a_malformed_clock_line_is_one_sentence(tmp_path, change, message):
    path = make_run(tmp_path / "runs" / "a", 1, [0.5, 0.9])
    lines = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    change(lines[1])
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = report(tmp_path / "runs", "--json")
    assert result.exit_code == 2 and message in result.output and "line 2" in result.output
    assert "Traceback" not in result.output


def test_curves_against_time_hold_each_seeds_last_finished_round(tmp_path):
    """At simulated time x a seed's accuracy is that of its last round finished by x (the server's model then)."""
    a = read_run(str(make_run(tmp_path / "a", 1, [0.2, 0.4, 0.6], round_time=1.0)))  # rounds end at 1, 2, 3 s
    b = read_run(str(make_run(tmp_path / "b", 2, [0.1, 0.3], round_time=1.5)))  # at 1.5, 3 s
    grid, mean, std = _step_curves([a, b], 0)
    assert grid[0] == 1.0 and grid[-1] == 3.0
    for x, expected in ((1.0, [20]), (1.6, [20, 10]), (2.5, [40, 10]), (3.0, [60, 30])):
        k = int(np.argmin(abs(grid - x)))
        held = [100 * acc[int(np.searchsorted(ends, grid[k], side="right")) - 1]
                for ends, acc in (([1, 2, 3], [0.2, 0.4, 0.6]), ([1.5, 3], [0.1, 0.3])) if grid[k] >= ends[0]]
        assert held == pytest.approx(expected)
        assert mean[k] == pytest.approx(np.mean(held))  # the sample std, as the tables (one seed: 0)
        assert std[k] == pytest.approx(np.std(held, ddof=1) if len(held) > 1 else 0.0)
    grid, mean, _ = _step_curves([a], 1)  # against bytes: 1 MB a round
    assert grid[-1] == 3e6 and mean[-1] == pytest.approx(60.0)


def test_report_reads_what_a_clocked_engine_run_writes(tmp_path):
    """A real clocked run (2 rounds): the table's time to each target is summary.json's time_to_accuracy_s."""
    from hasfl_ray.engine import Engine, RunConfig

    path = tmp_path / "runs" / "digits-hasfl-seed42"
    Engine(RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3, devices="lognormal", deadline=5.0),
           out_dir=str(path)).run()
    result = report(tmp_path / "runs", "--json", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    cells = json.loads(result.output)["clock"][0]["cells"]
    summary = json.loads((path / "summary.json").read_text())
    for target, seconds in summary["time_to_accuracy_s"].items():
        cell = cells[f"time_to_{target}_s"]
        assert cell == seconds if seconds == "not reached" else cell["mean"] == pytest.approx(seconds)
    assert cells["bytes"]["mean"] == pytest.approx(1e9 * summary["sim_gb"])
    assert cells["sim_time_s"]["mean"] == pytest.approx(3600 * summary["sim_hours"])
    assert (tmp_path / "out" / "digits-clock.png").exists()


def test_sync_and_async_runs_of_one_config_share_the_clock_figure_as_their_own_lines(tmp_path):
    """docs/async.md: an asynchronous run of a config is its own row and line (``HAS-FL (fedbuff)``) beside the
    synchronous one, and its unevaluated lines (null accuracy) leave its curve at the last evaluated accuracy."""
    runs = tmp_path / "runs"
    make_run(runs / "sync", 1, [0.4, 0.6, 0.8])
    path = make_run(runs / "async", 1, [0.3, 0.5, 0.7, 0.9], round_time=1.0)
    config = yaml.safe_load((path / "config.yaml").read_text())
    (path / "config.yaml").write_text(yaml.safe_dump({**config, "mode": "async", "async_rule": "fedbuff",
                                                      "deadline": None}))
    lines = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    lines[2]["test_accuracy"] = None  # not evaluated at update 2
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = clock_table([read_run(str(runs / "sync")), read_run(str(path))])
    assert [row["algorithm"] for row in table["rows"]] == ["hasfl", "hasfl (fedbuff)"]
    async_row = table["rows"][1]["cells"]
    assert async_row["time_to_0.9_s"]["mean"] == 4.0 and async_row["time_to_0.5_s"]["mean"] == 2.0
    grid, mean, _ = _step_curves([read_run(str(path))], 0)
    at_three = mean[np.searchsorted(grid, 3.0, side="right") - 1]
    assert at_three == pytest.approx(50.0)  # update 2 (3 s) unevaluated: still update 1's 50 %


def test_the_protocol_line_of_an_asynchronous_run_counts_server_updates():
    from hasfl_ray.analysis.tables.layout import protocol_line

    sync = {"clients": 20, "clients_per_round": 10, "rounds": 40, "local_epochs": 2, "alpha": 0.3, "dataset": "digits"}
    assert protocol_line(sync) == "N=20, 10/round, T=40, K=2, α=0.3"
    assert protocol_line({**sync, "mode": "async", "concurrency": 10, "rounds": 740}) == \
        "N=20, C=10 in flight, T=740 server updates, K=2, α=0.3"


def test_a_sparse_test_cadence_is_named_under_the_time_to_accuracy_table(tmp_path):
    """A run that tested every 3rd round dates a target to the first tested round after reaching it: the caption
    says so (before, it read as every run's first round to reach it), and says nothing where every run tested each
    round."""
    every = [read_run(str(make_run(tmp_path / f"s{seed}", seed, [0.4, 0.85, 0.9, 0.96]))) for seed in (1, 2)]
    assert "--test-every" not in clock_table(every)["caption"]
    sparse = make_run(tmp_path / "sparse", 3, [0.4, 0.85, 0.9, 0.96])
    config = yaml.safe_load((sparse / "config.yaml").read_text())
    (sparse / "config.yaml").write_text(yaml.safe_dump({**config, "test_every": 3}))
    caption = clock_table(every + [read_run(str(sparse))])["caption"]
    assert "test accuracy every 3 rounds in some runs (--test-every)" in caption
    assert "first round tested after reaching them" in caption
