"""Reports of every sweep (issue 49 item 2): one row key for tables, figures and Table 5 (hasfl_ray/analysis/rows.py),
so `report` and `plot` of a sweep with variants of one algorithm (every reproduction pack) write their tables and a
line per row; the matched-budget control reports across seeds; local accuracies scored at different widths are
refused by name; the Type column is the method's; TeX escapes a variant's name whole."""

import csv
import json
import os

import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.analysis import plots
from hasfl_ray.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--rounds", "1", "--clients", "6", "--clients-per-round", "3", "--backend", "local", "--quiet"]
#: A variant's name with TeX's specials (battery 5, A228: table.tex left `$ ^ { }` raw).
ODD = "g^{0.9}$"


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def legends(monkeypatch):
    """{figure file name: the legend texts of each of its axes}, of every figure written while the test runs."""
    seen = {}
    save = plots._save

    def recording(fig, out_dir, name, fmt="png"):
        seen[name] = [[t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []
                      for ax in fig.axes]
        return save(fig, out_dir, name, fmt)

    monkeypatch.setattr(plots, "_save", recording)
    return seen


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """A finished sweep holding two variants of FedAvg (fedavg, fa-fast: lr 0.1) and two of HAS-FL (hasfl, ODD:
    gamma 0.9), one round each."""
    root = tmp_path_factory.mktemp("variants")
    config = root / "V.yaml"
    config.write_text(yaml.safe_dump({"sweep": {
        "datasets": ["digits"], "algorithms": ["fedavg", "fa-fast", "hasfl", ODD], "seeds": [42],
        "variants": {"fa-fast": {"algorithm": "fedavg", "lr": 0.1}, ODD: {"algorithm": "hasfl", "gamma": 0.9}}}}))
    out = str(root / "sweep")
    result = invoke("sweep", str(config), *TINY, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_report_and_plot_of_two_variants_of_one_algorithm_write_every_table_and_figure(variants, legends, tmp_path):
    # battery 5 problem 9: ValueError 'min() arg is an empty sequence' (plots.py _curves), exit 1, table.md written
    result = invoke("report", variants, "--out", str(tmp_path / "report"))
    assert result.exit_code == 0, result.output
    names = set(os.listdir(tmp_path / "report"))
    assert {"table.md", "table.csv", "table.tex", "digits-convergence.png", "digits-heterogeneity.png",
            "digits-allocations.png", "digits-frontier.png"} <= names
    rows = [r["algorithm"] for r in csv.DictReader(open(tmp_path / "report" / "table.csv", encoding="utf-8"))]
    assert rows == ["fedavg", "fa-fast", "hasfl", ODD]  # a row per variant, in the sweep's order
    # a line of the figures per row of the table, in its order (the frontier: a point per row)
    drawn = [text.split(" (")[0] for text in legends["digits-convergence.png"][0]]
    assert drawn == ["FedAvg", "fa-fast", "HAS-FL", ODD]
    assert len(legends["digits-frontier.png"][0]) == 4
    legends.clear()
    result = invoke("plot", variants, "--out", str(tmp_path / "figures"))
    assert result.exit_code == 0, result.output
    assert {"digits-convergence.png", "digits-frontier.png"} <= set(os.listdir(tmp_path / "figures"))
    assert [text.split(" (")[0] for text in legends["digits-convergence.png"][0]] == drawn


def test_variant_rows_have_their_methods_type(variants, tmp_path):
    # battery 5 problem 14: the Type column looked the method up by the row's label: every variant was "Sub-model"
    result = invoke("report", variants, "--json")
    assert result.exit_code == 0, result.output
    types = {row["algorithm"]: row["type"] for row in json.loads(result.output)["table"]}
    assert types == {"fedavg": "Full-model", "fa-fast": "Full-model", "hasfl": "Sub-model (adaptive)",
                     ODD: "Sub-model (adaptive)"}


def test_table_tex_escapes_every_special_character_of_a_variants_name(variants, tmp_path):
    # battery 5's smaller notes (A228): table.tex escaped \ _ & % # but left $ ^ { } of a variant name raw
    assert invoke("report", variants, "--out", str(tmp_path / "r")).exit_code == 0
    for name in ("table.tex", "local.tex", "fairness.tex"):
        tex = (tmp_path / "r" / name).read_text(encoding="utf-8")
        line = next(line for line in tex.splitlines() if line.lstrip(" &").startswith("g"))
        assert line.lstrip(" &").startswith(r"g\textasciicircum{}\{0.9\}\$ &"), (name, line)


def test_a_reproduction_pack_with_two_rows_reports_and_plots(tmp_path, legends):
    # battery 5 problem 9 as it ran (A135): pack-heterofl's iid-e and noniid2-e, two variants of HeteroFL
    out = str(tmp_path / "het")
    result = invoke("sweep", os.path.join(REPO, "configs", "pack-heterofl-cifar10.yaml"), "--datasets", "digits",
                    "--algorithms", "iid-e,noniid2-e", "--local-epochs", "1", "--seeds", "42", "--rounds", "1",
                    "--clients", "10", "--clients-per-round", "2", "--backend", "local", "--quiet", "--out", out,
                    "--input-normalization", "split")  # the pack's CIFAR constants have no digits counterpart
    assert result.exit_code == 0, result.output
    result = invoke("report", out)
    assert result.exit_code == 0, result.output
    table = (tmp_path / "het" / "report" / "table.md").read_text(encoding="utf-8")
    assert "| Digits | iid-e | Sub-model (static) | 42 |" in table
    assert "| Digits | noniid2-e | Sub-model (static) | 42 |" in table
    assert [t.split(" (")[0] for t in legends["digits-convergence.png"][0]] == ["iid-e", "noniid2-e"]
    result = invoke("plot", out, "--out", str(tmp_path / "figures"))
    assert result.exit_code == 0, result.output
    assert "digits-local.png" in os.listdir(tmp_path / "figures")  # noniid2-e scores local accuracy


def test_the_matched_budget_control_reports_across_seeds(tmp_path):
    # battery 5 / issue 49 item 2: random-budget's budget_from names the HAS-FL run of its own seed (by design), and
    # the budget it realised is that seed's: the report refused the row as "differ in algorithm_options"
    out = str(tmp_path / "mb")
    result = invoke("sweep", os.path.join(REPO, "configs", "table6-full-model.yaml"), "--datasets", "digits",
                    "--algorithms", "hasfl,random-budget", "--seeds", "42,43", "--local-epochs", "1", *TINY,
                    "--out", out)
    assert result.exit_code == 0, result.output
    sources = {seed: yaml.safe_load(open(os.path.join(out, f"digits-random-budget-seed{seed}", "config.yaml")))[
        "algorithm_options"]["budget_from"] for seed in (42, 43)}
    assert sources[42] != sources[43]  # each seed's own HAS-FL run
    result = invoke("report", out, "--json")
    assert result.exit_code == 0, result.output
    rows = {row["algorithm"]: row for row in json.loads(result.output)["table"]}
    assert rows["random-budget"]["seeds"] == [42, 43] and rows["random-budget"]["type"] == "Sub-model (random)"
    # a budget taken from the run of another seed is another setting: still refused by name
    config = os.path.join(out, "digits-random-budget-seed43", "config.yaml")
    values = yaml.safe_load(open(config))
    values["algorithm_options"]["budget_from"] = sources[42]
    open(config, "w").write(yaml.safe_dump(values))
    result = invoke("report", out, "--json")
    assert result.exit_code == 2 and "differ in algorithm_options.budget_from" in result.output, result.output
    assert "Traceback" not in result.output


def simulate(out, seed, width):
    result = invoke("simulate", "--rounds", "1", "--clients", "6", "--clients-per-round", "3", "--backend", "local",
                    "--seed", str(seed), "--local-eval-width", width, "--out", out, "--quiet")
    assert result.exit_code == 0, result.output


def test_local_accuracies_scored_at_different_widths_are_refused_by_name(tmp_path):
    # battery 5 problem 5: --local-eval-width p-max and final pooled as seeds of one row, without a word
    simulate(str(tmp_path / "mx" / "a"), 48, "p-max")
    simulate(str(tmp_path / "mx" / "b"), 49, "final")
    for command in (["report", str(tmp_path / "mx")], ["plot", str(tmp_path / "mx"), "--out", str(tmp_path / "f")],
                    ["report", str(tmp_path / "mx"), "--json"]):
        result = invoke(*command)
        assert result.exit_code == 2, result.output
        assert "differ in local_eval_width ('p_max' against 'final')" in result.output, result.output
        assert "scored at different widths" in result.output and "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "f")  # refused before anything is written
    simulate(str(tmp_path / "same" / "a"), 48, "p-max")
    simulate(str(tmp_path / "same" / "b"), 49, "p-max")
    result = invoke("report", str(tmp_path / "same"), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["local"][0]["seeds"] == [48, 49]


def test_an_asynchronous_rows_type_is_its_methods(tmp_path):
    # battery 5 problem 14: FedAvg's FedBuff row said Sub-model beside the synchronous row's Full-model
    from hasfl_ray.analysis import read_run, summarise_runs
    from hasfl_ray.analysis.report import table_csv, table_latex, table_markdown

    from test_report import make_run
    from test_report_rows import set_config

    for name, extra in (("sync", {}), ("async", {"mode": "async", "async_rule": "fedbuff"})):
        make_run(tmp_path / name, 42, 0.8, 0.7, algorithm="fedavg")
        set_config(tmp_path / name, **extra)
    rows = summarise_runs([read_run(str(tmp_path / name)) for name in ("sync", "async")])
    assert [(row["algorithm"], row["type"]) for row in rows] == [("fedavg", "Full-model"),
                                                                  ("fedavg (fedbuff)", "Full-model")]
    assert "| Digits | FedAvg (fedbuff) | Full-model | 42 |" in table_markdown(rows)
    assert [r["type"] for r in csv.DictReader(table_csv(rows).splitlines())] == ["Full-model", "Full-model"]
    assert r"FedAvg (fedbuff) & Full-model &" in table_latex(rows, "Digits")
