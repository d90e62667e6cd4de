"""`hasfl-ray report` and the confound statistics against hand-made run directories."""

import csv
import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.analysis import partial_correlation
from hasfl_ray.cli.main import main


def make_run(path, seed, best, final, algorithm="hasfl", coverage=True, h=None):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"dataset": "digits", "algorithm": algorithm,
                                                      "coverage": coverage, "seed": seed}))
    (path / "summary.json").write_text(json.dumps({"best_accuracy": best, "final_accuracy": final, "avg_p": 0.5,
                                                   "rounds": 3, "params_sha256": "x", "wall_s": 1.0}))
    rng = np.random.default_rng(seed)
    with open(path / "clients.csv", "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=["client", "num_samples", "p_max", "tv_distance", "h_tilde",
                                                    "p_final", "name"])
        writer.writeheader()
        for i in range(8):
            p_max = [0.25, 0.5, 0.75, 1.0][i % 4]
            writer.writerow({"client": i, "num_samples": 10, "p_max": p_max, "tv_distance": rng.random(),
                             "h_tilde": 2 - p_max + 0.01 * i if h is None else h, "p_final": p_max, "name": i})


def test_report_mean_and_sample_std(tmp_path):
    make_run(tmp_path / "a", 42, 0.80, 0.70)
    make_run(tmp_path / "b", 43, 0.90, 0.74)
    make_run(tmp_path / "c", 44, 0.70, 0.60, coverage=False)
    result = CliRunner().invoke(main, ["report", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    table = {row["algorithm"]: row for row in json.loads(result.output)["table"]}
    assert table["hasfl"]["best_mean"] == pytest.approx(85.0)
    assert table["hasfl"]["best_std"] == pytest.approx(np.std([80, 90], ddof=1))
    assert table["hasfl (coverage off)"]["seeds"] == [44]
    confound = json.loads(result.output)["confound"]
    assert all(row["r_h_pmax"] < -0.9 for row in confound)  # h was built to fall with p_max


def test_partial_correlation_removes_the_control():
    rng = np.random.default_rng(0)
    control = rng.normal(size=500)
    x = 3 * control + rng.normal(size=500)
    y = -2 * control + rng.normal(size=500)
    assert np.corrcoef(x, y)[0, 1] < -0.7
    assert abs(partial_correlation(x, y, control)) < 0.1


def test_report_without_runs_is_one_sentence(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "no finished runs" in result.output


def test_plot_writes_the_four_figures(tmp_path):
    from hasfl_ray.engine import Engine, RunConfig

    Engine(RunConfig(backend="local", rounds=2, clients=8, clients_per_round=4), out_dir=str(tmp_path / "runs" / "a")).run()
    result = CliRunner().invoke(main, ["plot", str(tmp_path / "runs"), "--out", str(tmp_path / "fig")])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (tmp_path / "fig").iterdir() if p.name != ".hasfl-ray-folder")  # its mark
    assert names == ["digits-allocations.png", "digits-convergence.png", "digits-frontier.png",
                     "digits-heterogeneity.png", "digits-local.png", "digits-widths.png"]  # the last two: issue 25
    assert all((tmp_path / "fig" / n).read_bytes()[:4] == b"\x89PNG" for n in names)


def test_report_over_a_sweep_writes_tables_and_figures(tmp_path):
    import csv as csv_module

    from hasfl_ray.engine import Engine, RunConfig

    sweep = tmp_path / "sweep"
    for algorithm, seed in (("hasfl", 42), ("hasfl", 43), ("uniform", 42)):
        Engine(RunConfig(backend="local", rounds=3, clients=8, clients_per_round=4, warmup=1, t_adapt=1, seed=seed,
                         algorithm=algorithm), out_dir=str(sweep / f"digits-{algorithm}-seed{seed}")).run()
    (sweep / "sweep.json").write_text(json.dumps({"algorithms": ["uniform", "hasfl"], "reproduces": "Table 3"}))
    result = CliRunner().invoke(main, ["report", str(sweep)])
    assert result.exit_code == 0, result.output
    out = sweep / "report"
    names = sorted(p.name for p in out.iterdir() if p.name != ".hasfl-ray-folder")  # the folder's mark (issue 37)
    assert names == ["analysis.json", "confound.csv", "confound.md", "confound.tex", "digits-allocations.png",
                     "digits-convergence.png", "digits-frontier.png", "digits-heterogeneity.png", "digits-local.png",
                     "digits-widths.png", "fairness.csv", "fairness.md", "fairness.tex", "local.csv", "local.md",
                     "local.tex", "table.csv", "table.md", "table.tex", "widths.csv", "widths.md", "widths.tex"]
    assert all((out / n).read_bytes()[:4] == b"\x89PNG" for n in names if n.endswith(".png"))
    markdown = (out / "table.md").read_text()
    for column in ("Type", "Best acc. (%)", "Final acc. (%)", "Peak→final Δ", "Avg. p"):
        assert column in markdown
    # 3 rounds are too short for a coverage warning's ‡ (tests/engine/test_coverage_monitor.py marks one)
    assert "| HAS-FL | Sub-model (adaptive) |" in markdown and "| Uniform | Sub-model (uniform) |" in markdown
    assert markdown.index("Uniform") < markdown.index("HAS-FL")  # the sweep's algorithm order
    rows = list(csv_module.DictReader(open(out / "table.csv")))
    assert {"best_mean", "best_std", "final_mean", "final_std", "peak_to_final", "avg_p"} <= set(rows[0])
    hasfl = next(r for r in rows if r["algorithm"] == "hasfl")
    assert hasfl["seeds"] == "42 43" and hasfl["type"] == "Sub-model (adaptive)"
    assert float(hasfl["peak_to_final"]) == pytest.approx(float(hasfl["final_mean"]) - float(hasfl["best_mean"]))
    tex = (out / "table.tex").read_text()
    assert r"Peak$\to$final $\Delta$" in tex and "Sub-model (adaptive)" in tex and r"$\pm$" in tex and tex.count(r"\\") >= 3
    assert "r(H̃, TV | p^max)" in (out / "confound.md").read_text().replace("\\|", "|")
