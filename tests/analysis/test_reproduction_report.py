"""docs/reproduction/make_report.py rebuilds the write-up's tables and figures from the committed CSVs alone."""

import csv
import importlib.util
import math
import os
import pathlib

import numpy as np
import pytest
from scipy import stats

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "reproduction"
RESULTS = FOLDER / "results"


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"reproduction_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(path):
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def write(path, records):
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)


@pytest.fixture(scope="module")
def small_copy(tmp_path_factory):
    """A small copy of the committed results: the digits' HAS-FL and FjORD cells (3 seeds each, with clients and
    curves) and every carried-over row; make_report run on it into a temporary folder."""
    results, out = tmp_path_factory.mktemp("results"), tmp_path_factory.mktemp("report")
    keep = lambda r: r["group"] != "digits" or r["algorithm"] in ("hasfl", "fjord")  # noqa: E731
    for name in ("cells", "clients", "curves", "confound-carried", "aggregates-carried"):
        write(results / f"{name}.csv", [r for r in rows(RESULTS / f"{name}.csv") if keep(r)])
    load_script("make_report").main(str(results), str(out))
    return results, out


def test_the_committed_results_name_their_machine_hash_and_source():
    cells = rows(RESULTS / "cells.csv")
    digits = [c for c in cells if c["group"] == "digits"]
    assert {c["algorithm"] for c in digits} >= {"hasfl", "fjord", "uniform", "heterofl", "random-budget", "fedavg"}
    for cell in cells:
        assert cell["source"]
        if cell["source"].startswith("rerun"):  # a rerun cell carries its hash and the machine type it holds on
            assert len(cell["params_sha256"]) == 64 and "torch" in cell["machine"]
    assert {c["test_samples"] for c in cells} == {"359", "3420", "200"}


def test_the_table_is_the_mean_and_sample_std_of_the_cells(small_copy):
    results, out = small_copy
    finals = [100 * float(c["final_accuracy"]) for c in rows(results / "cells.csv")
              if c["group"] == "digits" and c["algorithm"] == "hasfl"]
    table = {r["algorithm"]: r for r in rows(out / "digits" / "table.csv")}
    assert set(table) == {"hasfl", "fjord"}
    assert float(table["hasfl"]["final_mean"]) == pytest.approx(np.mean(finals), abs=1e-9)
    assert float(table["hasfl"]["final_std"]) == pytest.approx(np.std(finals, ddof=1), abs=1e-9)
    assert (out / "digits" / "digits-convergence.png").stat().st_size > 0
    assert (out / "digits" / "digits-heterogeneity.png").stat().st_size > 0
    assert not list((out / "emnist-sample").glob("*.png"))  # no curves recorded: no figure


def test_pooled_confound_is_recomputed_from_the_client_rows(small_copy):
    results, out = small_copy
    clients = [c for c in rows(results / "clients.csv") if c["group"] == "digits" and c["algorithm"] == "hasfl"]
    h, p_max = (np.array([float(c[k]) for c in clients]) for k in ("h_tilde", "p_max"))
    pooled = next(r for r in rows(out / "digits" / "confound.csv") if r["seed"].startswith("pooled"))
    assert int(pooled["n_clients"]) == len(clients) == 60
    assert float(pooled["r_h_pmax"]) == pytest.approx(np.corrcoef(h, p_max)[0, 1], abs=1e-12)
    assert "95 % Fisher-z interval" in (out / "digits" / "confound.md").read_text(encoding="utf-8")


def test_carried_rows_pass_through_unchanged(small_copy):
    results, out = small_copy
    carried = next(r for r in rows(results / "confound-carried.csv")
                   if r["group"] == "emnist-sample" and r["algorithm"] == "hasfl")
    ours = next(r for r in rows(out / "emnist-sample" / "confound.csv") if r["algorithm"] == "hasfl")
    assert float(ours["r_h_tv_given_pmax"]) == float(carried["r_h_tv_given_pmax"])
    table = {r["algorithm"]: r for r in rows(out / "digits-paper-tier-mix" / "table.csv")}
    aggregate = next(r for r in rows(results / "aggregates-carried.csv") if r["algorithm"] == "hasfl")
    assert float(table["hasfl"]["avg_p"]) == float(aggregate["avg_p"])


def test_the_comparison_interval_is_the_paired_t_interval(small_copy):
    results, out = small_copy
    row = next(r for r in rows(out / "comparisons.csv") if r["group"] == "digits" and r["a"] == "hasfl"
               and r["b"] == "fjord")
    a, b = (np.array([float(v) for v in row[k].split()]) for k in ("a_per_seed", "b_per_seed"))
    d = a - b
    half = 4.302652729911275 * d.std(ddof=1) / math.sqrt(3)  # t(0.975, 2)
    assert float(row["ci_low"]) == pytest.approx(d.mean() - half, abs=0.01)
    assert float(row["ci_high"]) == pytest.approx(d.mean() + half, abs=0.01)
    assert float(row["welch_p"]) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, abs=0.01)


def test_table2_matches_hasfl_ray_cost(small_copy):
    _, out = small_copy
    assert {r["match"] for r in rows(out / "cost.csv")} == {"yes"}


def test_the_sign_rule_and_the_fisher_interval():
    report = load_script("make_report")
    low, high = report.fisher_interval(0.24, 60, controls=1)
    z, half = math.atanh(0.24), 1.959964 / math.sqrt(60 - 4)
    assert (low, high) == pytest.approx((math.tanh(z - half), math.tanh(z + half)))
    assert report.sign_verdict(0.24, (low, high)).startswith("inconclusive")
    assert report.sign_verdict(0.41, (0.05, 0.7)).startswith("positive")
    assert report.sign_verdict(-0.5, (-0.8, -0.1)).startswith("negative")
    tost = report.compare([98.0, 98.2, 97.9], [97.9, 98.1, 98.0], margin=1.0)
    assert tost["tost_p"] < 0.05 and tost["ci_low"] < 0 < tost["ci_high"]


def test_export_cells_writes_a_run_folder_and_keeps_the_cells_it_did_not_find(tmp_path, monkeypatch):
    """export_cells.py: a run folder of a sweep becomes one cells.csv row (its hash, machine, source), its clients
    and its rounds; a cell already in the CSVs that the runs do not hold keeps its row."""
    import json

    import yaml

    monkeypatch.syspath_prepend(str(FOLDER))  # export_cells imports make_report's CSV helpers, as when run
    export = load_script("export_cells")
    run = tmp_path / "runs" / "digits-table3-allocation" / "digits-hasfl-seed42"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"dataset": "digits", "algorithm": "hasfl", "seed": 42,
                                                     "rounds": 2, "clients": 4, "clients_per_round": 2,
                                                     "local_epochs": 1, "lr": 0.05, "estimator": "masked"}))
    (run / "summary.json").write_text(json.dumps({"best_accuracy": 0.9, "final_accuracy": 0.8, "avg_p": 0.5,
                                                  "rounds": 2, "params_sha256": "ab" * 32}))
    write(run / "clients.csv", [{"client": i, "num_samples": 5, "p_max": p, "tv_distance": 0.1 * i,
                                 "h_tilde": 1 + i, "p_final": p, "name": i} for i, p in enumerate((0.25, 1.0))])
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "test_accuracy": a, "test_loss": 1.0,
                                                           "avg_p": 0.5, "mean_h": 1.0, "frozen_fraction": 0.0})
                                               + "\n" for r, a in enumerate((0.9, 0.8))))
    results = tmp_path / "results"
    results.mkdir()
    old = {c: "" for c in export.CELL_COLUMNS}
    write(results / "cells.csv", [{**old, "group": "emnist-sample", "dataset": "emnist", "algorithm": "hasfl",
                                   "seed": "42", "source": "carried over"}])
    export.main([str(tmp_path / "runs"), str(results), "--machine", "test machine"])
    cells = {(c["group"], c["seed"]): c for c in rows(results / "cells.csv")}
    assert cells["emnist-sample", "42"]["source"] == "carried over"
    cell = cells["digits", "42"]
    assert (cell["params_sha256"], cell["machine"], cell["best_round"]) == ("ab" * 32, "test machine", "0")
    assert float(cell["final_accuracy"]) == 0.8 and cell["test_samples"] == "359"
    assert [c["h_tilde"] for c in rows(results / "clients.csv")] == ["1", "2"]
    assert [c["round"] for c in rows(results / "curves.csv")] == ["0", "1"]


#: Files of docs/reproduction/ written by hand (prose, the scripts' inputs), not by make_report.py.
HAND_WRITTEN = {"README.md", "clocked-digits.md", "league.md", "published-numbers.csv"}
#: Committed outputs whose runs are not in results/ yet (the sample trace of async-digits.md: 27 runs of
#: configs/digits-async-trace.yaml, `run.sh async-trace` then `run.sh export` and `run.sh report` rebuild them).
NOT_YET_REBUILT: set = set()  # every output is rebuilt from results/ (the sample trace since 2026-11-28)


def test_make_report_rebuilds_every_committed_output_byte_for_byte(tmp_path):
    """make_report.py on the committed results writes every table, CSV and figure of docs/reproduction/ (the pages'
    generated sections included) exactly as committed, and nothing committed there is left unwritten."""
    load_script("make_report").main(str(RESULTS), str(tmp_path))
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    differ = sorted(name for name in written if (FOLDER / name).read_bytes() != (tmp_path / name).read_bytes())
    assert differ == []
    committed = {p.relative_to(FOLDER).as_posix() for p in FOLDER.rglob("*")
                 if p.is_file() and p.suffix in (".csv", ".png", ".md", ".tex") and p.parts[-2] != "results"}
    assert sorted(committed - written - HAND_WRITTEN - NOT_YET_REBUILT) == []
    assert {"async-digits.png", "async-digits-clock.csv", "async-digits-seeds.csv", "async-digits-tests.csv",
            "clocked-digits.png", "clocked-digits.csv", "packs.md", "async-digits.md"} <= written


def test_exported_clock_lines_rebuild_what_the_run_folders_give(tmp_path, monkeypatch):
    """export_runs.py's clock-runs.csv and clock-lines.csv of two real clocked runs (a sweep folder: synchronous and
    FedBuff) give make_report.py the same time-to-accuracy table, the same equal-time rows and the same figure
    input as the run folders themselves; each row names the run's params_sha256, machine and commit."""
    import json

    from hasfl_ray.analysis import read_run
    from hasfl_ray.analysis.clocked import clock_table, trajectory
    from hasfl_ray.analysis.plots import read_metrics
    from hasfl_ray.analysis.report import grid_csv
    from hasfl_ray.engine import Engine, RunConfig

    monkeypatch.syspath_prepend(str(FOLDER))
    export, clock = load_script("export_runs"), load_script("report_clock")
    sweep = tmp_path / "runs" / "digits-async"
    tiny = dict(backend="local", clients=6, clients_per_round=3, local_epochs=1, seed=3, checkpoint_every=0,
                algorithm="heterofl", devices="lognormal", alpha=0.3)
    Engine(RunConfig(**tiny, rounds=3, deadline=0.5), out_dir=str(sweep / "digits-heterofl-sync-seed3")).run()
    Engine(RunConfig(**tiny, rounds=6, mode="async", concurrency=3, buffer_size=2),
           out_dir=str(sweep / "digits-heterofl-fedbuff-seed3")).run()
    (sweep / "sweep.json").write_text(json.dumps({"algorithms": ["heterofl-sync", "heterofl-fedbuff"]}))
    results = tmp_path / "results"
    results.mkdir()
    export.main([str(tmp_path / "runs"), str(results), "--machine", "test machine", "--commit", "abc1234"])
    runs = clock.load(str(results), load_script("make_report").read_csv)["async-lognormal"]
    folders = [read_run(str(sweep / name)) for name in ("digits-heterofl-sync-seed3", "digits-heterofl-fedbuff-seed3")]
    for run in folders:
        run["metrics"] = read_metrics(run["path"])
    assert [r["row"]["variant"] for r in runs] == ["heterofl-sync", "heterofl-fedbuff"]
    assert {(r["row"]["machine"], r["row"]["commit"]) for r in runs} == {("test machine", "abc1234")}
    assert [r["row"]["params_sha256"] for r in runs] == [f["summary"]["params_sha256"] for f in folders]
    for ours, theirs in zip(runs, folders):
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(trajectory(ours), trajectory(theirs)))
        assert ours["config"] == json.loads(json.dumps(theirs["config"]))
    assert grid_csv(clock_table(runs)) == grid_csv(clock_table(folders))
    equal = load_script("async_at_equal_time")
    from_folders = {name.split("-seed")[0].removeprefix("digits-"): [equal.trajectory(str(sweep / name))]
                    for name in sorted(os.listdir(sweep)) if name.startswith("digits-")}
    assert clock.equal_points(runs) == from_folders
