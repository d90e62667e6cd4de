"""`hasfl-ray report` over the fields of issue 25 (accuracy at each width, local accuracy, fairness): a real finished
run copied and given the contract's fields by hand, so these tests do not depend on the runs that write them."""

import csv
import json
import shutil

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.analysis.report import read_run, width_tables
from hasfl_ray.cli.main import main

WIDTHS = (0.25, 0.5, 0.75, 1.0)
UNDEFINED = "not defined for this dataset: its clients hold no labels"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One real run directory (2 rounds, 6 clients, digits), as runs written before issue 25 look."""
    from hasfl_ray.engine import Engine, RunConfig

    path = tmp_path_factory.mktemp("real") / "run"
    Engine(RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3), out_dir=str(path)).run()
    return path


SUMMARY_KEYS = ("accuracy_at_width_final", "accuracy_at_width_best", "local_accuracy", "local_accuracy_unmasked")
METRIC_KEYS = ("accuracy_at_width", "loss_at_width", "frozen_by_layer", "coverage_by_layer", "local_accuracy_mean",
               "local_accuracy_worst")


def copy_run(finished_run, path, algorithm="hasfl", seed=42, dataset="digits"):
    """A copy of the real run as another algorithm and seed, without the fields of issue 25 (a run written before
    them, whether or not the engine that made the real run writes them)."""
    shutil.copytree(finished_run, path)
    config = yaml.safe_load((path / "config.yaml").read_text())
    config.update(algorithm=algorithm, seed=seed, dataset=dataset)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    summary = json.loads((path / "summary.json").read_text())
    (path / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k not in SUMMARY_KEYS}))
    lines = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    (path / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in line.items() if k not in METRIC_KEYS})
                                                + "\n" for line in lines))
    with open(path / "clients.csv") as handle:
        rows = list(csv.reader(handle))
    keep = [i for i, column in enumerate(rows[0]) if not column.startswith("local_")]
    (path / "clients.csv").write_text("".join(",".join(row[i] for i in keep) + "\n" for row in rows))
    return path


def add_fields(path, level, widths=WIDTHS, local=True):
    """The contract's fields, accuracies ``level`` × width (clients' local accuracies around ``level``)."""
    summary = json.loads((path / "summary.json").read_text())
    summary["accuracy_at_width_final"] = {format(w, "g"): level * w for w in widths}
    summary["accuracy_at_width_best"] = {format(w, "g"): level * w + 0.01 for w in widths}
    with open(path / "clients.csv") as handle:
        clients = list(csv.DictReader(handle))
    accuracies = [level - 0.05 * (i % 3) for i in range(len(clients))]
    if local is True:
        for key, shift in (("local_accuracy", 0.0), ("local_accuracy_unmasked", -0.1)):
            values = np.array(accuracies) + shift
            summary[key] = {"mean": float(values.mean()), "worst": float(values.min()),
                            "p10": float(np.percentile(values, 10)), "median": float(np.median(values)),
                            "best": float(values.max()), "width": "final", "masked": key == "local_accuracy",
                            "per_tier": {format(float(p), "g"): float(np.mean([v for v, c in zip(values, clients)
                                                                            if c["p_max"] == p]))
                                         for p in sorted({c["p_max"] for c in clients})}}
    elif local is not None:
        summary["local_accuracy"] = summary["local_accuracy_unmasked"] = local
    (path / "summary.json").write_text(json.dumps(summary))
    with open(path / "clients.csv", "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(list(clients[0]) + ["local_accuracy", "local_accuracy_unmasked", "local_width",
                                            "local_test_samples"])
        for client, accuracy in zip(clients, accuracies):
            cells = [accuracy, accuracy - 0.1, client["p_final"], 100] if local is True else ["", "", "", ""]
            writer.writerow(list(client.values()) + cells)
    lines = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        line["accuracy_at_width"] = summary["accuracy_at_width_final"]
        line["loss_at_width"] = {format(w, "g"): 1.0 for w in widths}
        line["frozen_by_layer"] = {"conv1.weight": 0.5}
        line["coverage_by_layer"] = {"conv1.weight": 0.25}
    lines[-1]["local_accuracy_mean"] = summary.get("local_accuracy", {}).get("mean") if local is True else None
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def report(*args):
    result = CliRunner().invoke(main, ["report", *map(str, args)])
    return result


def test_width_table_is_mean_and_std_over_seeds_per_width(finished_run, tmp_path):
    """issue 25 item 5: one column per width, mean ± sample std over seeds, rows per dataset × algorithm."""
    add_fields(copy_run(finished_run, tmp_path / "runs" / "a", seed=1), 0.8)
    add_fields(copy_run(finished_run, tmp_path / "runs" / "b", seed=2), 0.6)
    add_fields(copy_run(finished_run, tmp_path / "runs" / "c", algorithm="heterofl"), 0.5, widths=(0.5, 1.0))
    result = CliRunner().invoke(main, ["report", str(tmp_path / "runs"), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["algorithm"]: row for row in json.loads(result.output)["widths"]}
    cell = rows["hasfl"]["cells"]["p=0.25"]
    assert cell["mean"] == pytest.approx(100 * 0.25 * 0.7)
    assert cell["std"] == pytest.approx(np.std([20.0, 15.0], ddof=1)) and cell["n"] == 2
    assert rows["hasfl"]["cells"]["p=1_best"]["mean"] == pytest.approx(71.0)
    assert rows["heterofl"]["cells"]["p=0.25"] == "not recorded"  # a width this run did not evaluate
    assert rows["heterofl"]["cells"]["p=1"]["mean"] == pytest.approx(50.0)


def test_report_writes_the_tables_and_figures_in_md_csv_tex(finished_run, tmp_path):
    """issue 25 item 5: widths, local and fairness tables in md, csv and tex, the two figures, beside table.*."""
    runs = tmp_path / "runs"
    add_fields(copy_run(finished_run, runs / "digits-hasfl-seed1", seed=1), 0.8)
    add_fields(copy_run(finished_run, runs / "digits-hasfl-seed2", seed=2), 0.7)
    add_fields(copy_run(finished_run, runs / "digits-fedavg-seed1", algorithm="fedavg", seed=1), 0.9)
    result = report(runs, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    names = {p.name for p in out.iterdir()}
    assert {f"{t}.{x}" for t in ("widths", "local", "fairness") for x in ("md", "csv", "tex")} <= names
    assert {"digits-widths.png", "digits-local.png"} <= names
    assert all((out / n).read_bytes()[:4] == b"\x89PNG" for n in names if n.endswith(".png"))
    widths = (out / "widths.md").read_text()
    assert "| Dataset | Algorithm | Seeds | p = 0.25 | p = 0.5 | p = 0.75 | p = 1 |" in widths
    assert "| Digits | HAS-FL | 1, 2 | 18.8 ± 1.8 | 37.5 ± 3.5 | 56.2 ± 5.3 | 75.0 ± 7.1 |" in widths
    rows = {r["algorithm"]: r for r in csv.DictReader(open(out / "widths.csv"))}
    assert float(rows["fedavg"]["p=0.5_mean"]) == pytest.approx(45.0) and rows["hasfl"]["p=1_seeds"] == "2"
    tex = (out / "widths.tex").read_text()
    assert r"$p=0.25$" in tex and r"75.0 $\pm$ 7.1" in tex and r"\toprule" in tex
    local = (out / "local.md").read_text()
    assert "| Global acc. (%) | Local acc., masked (%) | Local acc., unmasked (%) |" in local
    fairness = list(csv.DictReader(open(out / "fairness.csv")))
    hasfl = next(r for r in fairness if r["algorithm"] == "hasfl")
    assert float(hasfl["worst_mean"]) == pytest.approx(100 * np.mean([0.8 - 0.1, 0.7 - 0.1]))
    assert {"tier=0.25_mean", "tier=1_mean", "p10_mean", "median_mean"} <= set(hasfl)
    assert "Tier p^max = 0.25" in (out / "fairness.md").read_text()
    assert "omitted" not in (out / "table.md").read_text()


def test_runs_written_before_say_not_recorded_and_tables_without_fields_are_omitted(finished_run, tmp_path):
    """issue 25 item 7: a run without the fields reports; its cells say "not recorded", and a table no run
    records is left out with one line saying why."""
    runs = tmp_path / "runs"
    copy_run(finished_run, runs / "old", seed=1)
    result = report(runs, "--out", tmp_path / "old-only")
    assert result.exit_code == 0, result.output
    assert not any(p.name.startswith(("widths", "local", "fairness")) or p.name.endswith(("-widths.png", "-local.png"))
                   for p in (tmp_path / "old-only").iterdir())
    for name in ("widths", "local", "fairness"):
        assert sum(line.startswith(f"{name} table omitted: no run") for line in result.output.splitlines()) == 1
        assert f"{name} table omitted: no run" in (tmp_path / "old-only" / "table.md").read_text()
    add_fields(copy_run(finished_run, runs / "new", seed=2), 0.8)
    result = report(runs, "--out", tmp_path / "mixed")
    assert result.exit_code == 0, result.output
    assert "| Digits | HAS-FL | 1, 2 | 20.0 (1/2 seeds) |" in (tmp_path / "mixed" / "widths.md").read_text()
    copy_run(finished_run, runs / "old-fedavg", algorithm="fedavg")
    result = CliRunner().invoke(main, ["report", str(runs), "--json"])
    fedavg = next(r for r in json.loads(result.output)["fairness"] if r["algorithm"] == "fedavg")
    assert set(fedavg["cells"].values()) == {"not recorded"}


def test_local_accuracy_not_defined_is_said_not_zero(finished_run, tmp_path):
    """issue 25 item 2: a dataset where local accuracy is not defined shows why, never a zero; the fairness table
    (no per-client numbers at all) is omitted with the reason."""
    add_fields(copy_run(finished_run, tmp_path / "runs" / "a", dataset="synthetic"), 0.8, local=UNDEFINED)
    result = report(tmp_path / "runs", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    local = (tmp_path / "out" / "local.md").read_text()
    assert "| not defined | not defined |" in local and f"- not defined: {UNDEFINED}" in local
    assert "fairness table omitted: no run has per-client local accuracies in summary.json (not defined" \
        in result.output
    assert not (tmp_path / "out" / "digits-local.png").exists()


@pytest.mark.parametrize("file, change, message", [
    ("summary.json", {"accuracy_at_width_final": [0.5]}, "has accuracy_at_width_final [0.5]; expected an object"),
    ("summary.json", {"accuracy_at_width_final": {"2": 0.5}}, "has accuracy_at_width_final entry '2': 0.5;"),
    ("summary.json", {"accuracy_at_width_best": {"0.5": "high"}}, "accuracy_at_width_best entry '0.5': 'high';"),
    ("summary.json", {"local_accuracy": {"mean": 0.5}}, "has local_accuracy worst None; expected an object"),
    ("summary.json", {"local_accuracy_unmasked": 3}, "has local_accuracy_unmasked 3; expected an object"),
    ("summary.json", {"local_accuracy": {"mean": 1, "worst": 1, "p10": 1, "median": 1, "per_tier": {"x": 1}}},
     "has local_accuracy per_tier entry 'x': 1;"),
    ("metrics.jsonl", {"accuracy_at_width": {"0.5": True}}, "line 1 has accuracy_at_width entry '0.5': True;"),
    ("metrics.jsonl", {"frozen_by_layer": "all"}, "line 1 has frozen_by_layer 'all'; expected an object of parameter"),
    ("metrics.jsonl", {"local_accuracy_mean": "x"}, "line 1 has local_accuracy_mean 'x'; expected a number in [0, 1] or null"),
    ("clients.csv", "local_accuracy", "line 2 has local_accuracy 'high'; expected a number in [0, 1] or nothing"),
])
def test_malformed_fields_are_one_sentence_naming_the_file(finished_run, tmp_path, file, change, message):
    """issue 25 item 5: the hardened readers check the new fields like the others: one sentence naming the file
    (exit 2), nothing written."""
    path = add_fields(copy_run(finished_run, tmp_path / "runs" / "a"), 0.8)
    target = path / file
    if file == "clients.csv":
        rows = list(csv.reader(open(target)))
        rows[1][rows[0].index(change)] = "high"
        target.write_text("".join(",".join(row) + "\n" for row in rows))
    elif file == "metrics.jsonl":
        lines = target.read_text().splitlines()
        target.write_text("\n".join([json.dumps({**json.loads(lines[0]), **change})] + lines[1:]) + "\n")
    else:
        target.write_text(json.dumps({**json.loads(target.read_text()), **change}))
    result = report(tmp_path / "runs", "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert message in result.output and repr(str(target)) in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_width_tables_keep_the_sweep_order(finished_run, tmp_path):
    """Rows follow the sweep's algorithm order, like table.md's."""
    for algorithm in ("hasfl", "uniform"):
        add_fields(copy_run(finished_run, tmp_path / f"digits-{algorithm}-seed42", algorithm=algorithm), 0.5)
    runs = [read_run(str(tmp_path / f"digits-{a}-seed42")) for a in ("hasfl", "uniform")]
    for order in (("uniform", "hasfl"), ("hasfl", "uniform")):
        tables = {t["name"]: t for t in width_tables(runs, order)}
        assert [r["algorithm"] for r in tables["widths"]["rows"]] == list(order)


def test_null_statistics_say_no_client_scored(finished_run, tmp_path):
    """A local accuracy block whose statistics are null (no client had a test sample of its labels) reports as
    such, not as an error or a zero."""
    path = add_fields(copy_run(finished_run, tmp_path / "runs" / "a"), 0.8)
    summary = json.loads((path / "summary.json").read_text())
    summary["local_accuracy"].update(mean=None, worst=None, p10=None, median=None, best=None, per_tier={})
    (path / "summary.json").write_text(json.dumps(summary))
    result = CliRunner().invoke(main, ["report", str(tmp_path / "runs"), "--json"])
    assert result.exit_code == 0, result.output
    fairness = json.loads(result.output)["fairness"][0]["cells"]
    assert fairness["mean"] == fairness["worst"] == "no client scored"


def test_report_reads_what_the_engine_writes(finished_run, tmp_path):
    """issue 25 items 1, 2, 5: the untouched real run (the engine of this tree) reports every table; its full-width
    column is its final test accuracy."""
    summary = json.loads((finished_run / "summary.json").read_text())
    result = CliRunner().invoke(main, ["report", str(finished_run), "--json"])
    assert result.exit_code == 0, result.output
    output = json.loads(result.output)
    assert output["omitted"] == []
    assert output["widths"][0]["cells"]["p=1"]["mean"] == pytest.approx(100 * summary["final_accuracy"])
    assert output["local"][0]["cells"]["local"]["mean"] == pytest.approx(100 * summary["local_accuracy"]["mean"])
