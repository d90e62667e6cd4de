"""RUN/metrics.csv (issue 45 item 5): metrics.jsonl's scalar keys, a row a round, in columns fixed by the kind of run,
written as the rounds are recorded and rebuilt on --resume, so it always holds metrics.jsonl's rounds."""

import csv
import json

import pytest

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.metrics_csv import ASYNC, BASE, CLOCKED, MetricsTable

SMALL = dict(backend="local", clients=6, clients_per_round=3, seed=5)


def read(run):
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    with open(run / "metrics.csv", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        rows = [dict(zip(header, row)) for row in reader]
    return lines, header, rows


def as_cell(value):
    return "" if value is None else repr(float(value)) if isinstance(value, float) else str(value)


def test_metrics_csv_holds_each_lines_scalars(tmp_path):
    Engine(RunConfig(rounds=3, **SMALL), out_dir=str(tmp_path / "run")).run()
    lines, header, rows = read(tmp_path / "run")
    assert header == [*BASE, "wall_s"]
    assert len(rows) == len(lines) == 3
    for line, row in zip(lines, rows):
        for key in header:
            assert row[key] == as_cell(line.get(key)), key
        assert "frozen_by_layer" not in row and "train_loss_by_client" not in row  # nested: metrics.jsonl only
    assert float(rows[0]["train_loss"]) > 0 and rows[-1]["local_accuracy_mean"] != ""


@pytest.mark.parametrize("options, extra", [(dict(devices="lognormal"), CLOCKED),
                                            (dict(mode="async", devices="lognormal", concurrency=3, buffer_size=2),
                                             CLOCKED + ASYNC)], ids=["clocked", "async"])
def test_the_columns_are_fixed_by_the_kind_of_run(tmp_path, options, extra):
    Engine(RunConfig(rounds=3, **SMALL, **options), out_dir=str(tmp_path / "run")).run()
    lines, header, rows = read(tmp_path / "run")
    assert header == [*BASE, *extra, "wall_s"]
    assert [row["round"] for row in rows] == [str(line["round"]) for line in lines]
    assert all(row["sim_time_s"] == as_cell(line["sim_time_s"]) != "" for row, line in zip(rows, lines))


def test_resume_rebuilds_metrics_csv_from_the_checkpoint(tmp_path):
    config = RunConfig(rounds=4, checkpoint_every=2, **SMALL)
    Engine(config, out_dir=str(tmp_path / "reference")).run()
    crashed = Engine(config, out_dir=str(tmp_path / "run"))
    run_round = crashed.run_round

    def crash_in_round_3(t):
        if t == 3:
            raise KeyboardInterrupt
        return run_round(t)

    crashed.run_round = crash_in_round_3
    with pytest.raises(KeyboardInterrupt):
        crashed.run()
    lines, _, rows = read(tmp_path / "run")
    assert len(rows) == len(lines) == 3  # the rounds metrics.jsonl holds; the checkpoint holds 2 of them
    Engine(config, out_dir=str(tmp_path / "run"), resume=True).run()
    strip = lambda rows: [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]  # noqa: E731
    ours, theirs = read(tmp_path / "run"), read(tmp_path / "reference")
    assert ours[1] == theirs[1] and strip(ours[2]) == strip(theirs[2]) and len(ours[2]) == 4


def test_a_scalar_key_beyond_the_known_ones_gets_a_column_and_earlier_rows_an_empty_cell():
    table = MetricsTable()
    table.reset([{"round": 0, "test_accuracy": None, "wall_s": 1.5, "nested": {"a": 1}}])
    text = table.add({"round": 1, "test_accuracy": 0.25, "wall_s": 2.0, "mine": 7, "note": "text"})
    table.commit()
    header, first, second = text.splitlines()
    assert header.split(",") == [*BASE, "wall_s", "mine"]
    assert first.split(",")[0] == "0" and first.split(",")[1] == "" and first.split(",")[-1] == ""
    assert second.split(",")[1] == "0.25" and second.split(",")[-1] == "7"
    assert table.render() == text
