"""A report never pools what differs (issue 37 item 3): runs are rows by sweep variant, not by the config's
algorithm name (pack-fjord's KD and no-KD rows were one row with seeds "42, 42"), and runs of one row that differ in
anything but the seed, or repeat a seed, are refused in one sentence naming the field; Table 5's pooling follows."""

import json

import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main

from test_report import make_run


def set_config(path, **values):
    config = yaml.safe_load((path / "config.yaml").read_text())
    config.update(values)
    (path / "config.yaml").write_text(yaml.safe_dump(config))


def report(folder):
    return CliRunner().invoke(main, ["report", str(folder), "--json"])


def test_sweep_variants_of_one_algorithm_are_rows_of_their_own(tmp_path):
    for variant, distill in (("fjord-kd", 1.0), ("fjord-no-kd", 0.0)):
        for seed, best in ((42, 0.8), (43, 0.7)):
            run = tmp_path / f"digits-{variant}-seed{seed}"
            make_run(run, seed, best + distill / 10, best, algorithm="fjord")
            set_config(run, algorithm_options={"fjord_distill_weight": distill})
    result = report(tmp_path)
    assert result.exit_code == 0, result.output
    rows = {row["algorithm"]: row for row in json.loads(result.output)["table"]}
    assert set(rows) == {"fjord-kd", "fjord-no-kd"}
    assert rows["fjord-kd"]["seeds"] == [42, 43] and rows["fjord-no-kd"]["seeds"] == [42, 43]
    assert rows["fjord-kd"]["best_mean"] > rows["fjord-no-kd"]["best_mean"]
    pooled = {row["algorithm"]: row for row in json.loads(result.output)["pooled"]}  # Table 5 over each row's seeds
    assert set(pooled) == {"fjord-kd", "fjord-no-kd"}
    assert all(row["seeds"] == [42, 43] and row["n_clients"] == 16 for row in pooled.values())


def test_runs_of_one_row_that_differ_in_the_protocol_are_refused_naming_the_field(tmp_path):
    make_run(tmp_path / "a", 42, 0.8, 0.7)
    make_run(tmp_path / "b", 43, 0.9, 0.8)
    set_config(tmp_path / "b", lr=0.5)
    result = report(tmp_path)
    assert result.exit_code == 2 and "differ in lr" in result.output and "Traceback" not in result.output
    assert "expected the seeds of one row to share every setting but the seed" in result.output


def test_executing_differently_is_not_a_different_protocol(tmp_path):
    make_run(tmp_path / "a", 42, 0.8, 0.7)
    make_run(tmp_path / "b", 43, 0.9, 0.8)
    set_config(tmp_path / "a", backend="ray", actors=2)
    set_config(tmp_path / "b", backend="local", trainer_threads=2)
    result = report(tmp_path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["table"][0]["seeds"] == [42, 43]


def test_a_seed_twice_in_one_row_is_refused(tmp_path):
    make_run(tmp_path / "a", 42, 0.8, 0.7)
    make_run(tmp_path / "b", 42, 0.9, 0.8)
    result = report(tmp_path)
    assert result.exit_code == 2 and "are both seed 42" in result.output


def test_two_runs_of_one_seed_that_differ_in_a_setting_are_named_by_the_setting(tmp_path):
    # h56: a clocked run beside a plain one, both seed 42, was refused as "both seed 42" (a repeat to delete),
    # never naming the deadline that made them two experiments
    make_run(tmp_path / "a", 42, 0.8, 0.7)
    make_run(tmp_path / "b", 42, 0.9, 0.8)
    set_config(tmp_path / "b", deadline=2.0)
    result = report(tmp_path)
    assert result.exit_code == 2 and "differ in deadline" in result.output and "both seed" not in result.output
