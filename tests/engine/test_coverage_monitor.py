"""The coverage monitor: a run whose frozen fraction stays above 0 after warm-up warns once in its log and gets a
coverage_warning block in summary.json; a run that trains every coordinate gets neither; report marks the row."""

import json

from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine.coverage import WARN_AFTER_ROUNDS, coverage_warning, frozen_streak_start, should_warn

RUN = ["simulate", "--backend", "local", "--rounds", "16", "--clients", "6", "--clients-per-round", "3",
       "--quiet", "--warmup", "10"]


def lines(fractions):
    return [{"round": t, "frozen_fraction": f} for t, f in enumerate(fractions)]


def test_streak_and_warning_on_hand_made_histories():
    assert frozen_streak_start(lines([0.5, 0.0, 0.2, 0.3])) == 2
    assert frozen_streak_start(lines([0.5, 0.2, 0.0])) is None
    history = lines([0.7] * 20)
    warned = [t for t in range(20) if should_warn(history[:t + 1], warmup=10)]
    assert warned == [10 + WARN_AFTER_ROUNDS - 1]  # once, five rounds into the post-warm-up streak
    block = coverage_warning(history, warmup=10)
    assert block["first_round"] == 0 and block["frozen_fraction"] == 0.7 and block["post_warmup_rounds"] == 10
    assert "no participant covered" in block["cause"]
    assert coverage_warning(lines([0.7] * 8), warmup=10) is None  # never past warm-up
    assert coverage_warning(lines([0.7] * 15 + [0.0]), warmup=10) is None  # covered in the end
    # a few coordinates frozen in the last round only (an update rounded away): not a coverage problem
    assert coverage_warning(lines([0.0] * 199 + [0.3]), warmup=10) is None
    assert coverage_warning(lines([0.0] * 195 + [0.3] * 5), warmup=10)["post_warmup_rounds"] == 5
    # a negligible fraction for ever (2 coordinates of a 3.25M-parameter CNN): no warning either
    assert coverage_warning(lines([6e-7] * 30), warmup=10) is None
    assert not any(should_warn(lines([6e-7] * t), warmup=10) for t in range(1, 31))


def test_uniform_run_is_flagged_in_the_log_summary_and_report(tmp_path):
    runs = tmp_path / "runs"
    uniform = runs / "uniform"
    result = CliRunner().invoke(main, RUN + ["--algorithm", "uniform", "--out", str(uniform)])
    assert result.exit_code == 0, result.output
    summary = json.loads((uniform / "summary.json").read_text())
    block = summary["coverage_warning"]
    assert block["frozen_fraction"] > 0.5 and block["first_round"] == 0
    log = (uniform / "log.txt").read_text()
    assert log.count("has stayed at w^(0)") == 1 and "no participant covered" in log
    hasfl = runs / "hasfl"
    assert CliRunner().invoke(main, RUN + ["--algorithm", "hasfl", "--out", str(hasfl)]).exit_code == 0
    assert "coverage_warning" not in json.loads((hasfl / "summary.json").read_text())
    assert "has stayed at w^(0)" not in (hasfl / "log.txt").read_text()
    report = CliRunner().invoke(main, ["report", str(runs), "--out", str(runs / "report")])
    assert report.exit_code == 0, report.output
    table = (runs / "report" / "table.md").read_text()
    assert "Uniform ‡" in table and "HAS-FL ‡" not in table and "coverage warning" in table
    csv_text = (runs / "report" / "table.csv").read_text()
    assert "coverage_warnings" in csv_text.splitlines()[0]
