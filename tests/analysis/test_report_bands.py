"""A figure's ± std band over seeds is the sample standard deviation, as every table's ± is (docs/metrics.md "In the
report": mean ± sample standard deviation over seeds): the league figure's band at the budget is the league table's
± at the budget, and the convergence figure's band at the last round is the results table's ± of the final
accuracy. The bands were numpy's population std (ddof 0), 0.71 of the tables' with two seeds (h57)."""

import numpy as np
import pytest
from test_report_clock import make_run

from hasfl_ray.analysis.clocked import _step_curves
from hasfl_ray.analysis.league import league_table
from hasfl_ray.analysis.plots import _curves
from hasfl_ray.analysis.report import read_run
from hasfl_ray.analysis.tables.summary import summarise_runs
from hasfl_ray.analysis.statistics import nan_mean_std


def two_seeds(tmp_path):
    return [read_run(str(make_run(tmp_path / f"digits-hasfl-seed{seed}", seed, accuracies, round_time=1.0)))
            for seed, accuracies in ((1, [0.2, 0.5, 0.8]), (2, [0.4, 0.6, 0.7]))]


def test_the_league_figures_band_at_the_budget_is_the_tables_spread(tmp_path):
    runs = two_seeds(tmp_path)
    cell = league_table(runs)["rows"][0]["cells"]["global@time"]  # the default budget: 3 s, both runs' end
    assert cell["mean"] == pytest.approx(75.0) and cell["std"] == pytest.approx(np.std([80.0, 70.0], ddof=1))
    grid, mean, std = _step_curves(runs, 0)
    assert grid[-1] == 3.0
    assert mean[-1] == pytest.approx(cell["mean"]) and std[-1] == pytest.approx(cell["std"])


def test_the_convergence_band_at_the_last_round_is_the_tables_spread(tmp_path):
    runs = two_seeds(tmp_path)
    row = summarise_runs(runs)[0]
    rounds, mean, std = _curves(runs, "test_accuracy", 100.0)
    assert rounds[-1] == 3
    assert mean[-1] == pytest.approx(row["final_mean"]) and std[-1] == pytest.approx(row["final_std"])


def test_a_point_with_one_seed_has_no_spread_and_one_with_none_has_no_value():
    values = np.array([[1.0, np.nan, np.nan], [3.0, 5.0, np.nan]])
    mean, std = nan_mean_std(values)
    assert mean[:2].tolist() == [2.0, 5.0] and np.isnan(mean[2])
    assert std[0] == pytest.approx(np.sqrt(2.0)) and std[1] == 0.0 and np.isnan(std[2])
