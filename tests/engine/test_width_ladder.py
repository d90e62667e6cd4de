"""Any width ladder (``widths``, ``width_mix``, ``width_assignment``): the paper's tiers are one ladder and the
default, drawn exactly as before; custom ladders and HeteroFL's notation, fixed or redrawn every round; every
built-in algorithm trains under one; bad input is one sentence."""

import csv
import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.data.partition import PAPER_RUNS_TIER_COUNTS
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.engine import capacity_tiers, round_capacities
from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import WidthLadder, ladder_of
from hasfl_ray.registry import registered

HETEROFL = [1.0, 0.5, 0.25, 0.125, 0.0625]
BUILT_INS = ("hasfl", "heterofl", "fjord", "uniform", "random-budget", "fedavg", "fedprox", "scaffold", "fedrolex")
TINY = dict(backend="local", clients=6, clients_per_round=3, rounds=3, local_epochs=1, warmup=1, t_adapt=1, seed=3,
            checkpoint_every=0)


@pytest.mark.parametrize("clients", [1, 7, 10, 20, 33, 100])
def test_the_papers_tiers_as_a_ladder_draw_exactly_the_default(clients):
    default = capacity_tiers(42, clients)
    for spelled in (dict(widths=[0.25, 0.5, 0.75, 1.0], width_mix=[8, 5, 4, 3]), dict(width_mix=[40, 25, 20, 15]),
                    dict(widths=[0.25, 0.5, 0.75, 1], width_mix="0.4,0.25,0.2,0.15")):
        config = RunConfig(backend="local", clients=max(clients, 10), clients_per_round=1, **spelled)
        np.testing.assert_array_equal(capacity_tiers(42, clients, ladder=ladder_of(config)), default)
    assert ladder_of(RunConfig(backend="local")) == WidthLadder()
    paper_runs = RunConfig(backend="local", tier_counts=list(PAPER_RUNS_TIER_COUNTS))
    np.testing.assert_array_equal(capacity_tiers(42, 20, paper_runs.tier_counts, ladder_of(paper_runs)),
                                  capacity_tiers(42, 20, PAPER_RUNS_TIER_COUNTS))


def test_the_default_config_keeps_every_new_field_at_its_default():
    config = RunConfig(backend="local")
    assert (config.widths, config.width_mix, config.width_assignment, config.partition) == \
        (None, None, "fixed", "dirichlet")
    assert ladder_of(config).widths == (0.25, 0.5, 0.75, 1.0)


def counts(p_max, widths):
    return [int((p_max == w).sum()) for w in widths]


def test_a_custom_ladder_deals_its_mix_by_largest_remainder():
    config = RunConfig(backend="local", clients=10, widths=HETEROFL, width_mix=[1, 1, 1, 1, 1])
    assert counts(capacity_tiers(0, 10, ladder=ladder_of(config)), HETEROFL) == [2, 2, 2, 2, 2]
    equal = RunConfig(backend="local", clients=10, widths=HETEROFL)  # no mix: equal shares
    assert ladder_of(equal).probabilities == (0.2,) * 5
    exact = RunConfig(backend="local", clients=10, widths=[1, 0.5], tier_counts=[3, 7])
    assert counts(capacity_tiers(0, 10, exact.tier_counts, ladder_of(exact)), [1, 0.5]) == [3, 7]


def test_heterofl_notation_names_widths_and_shares():
    config = RunConfig(backend="local", clients=100, clients_per_round=10, width_mix="a6-b10-c11-d18-e55")
    assert config.widths == HETEROFL and config.width_mix == [6, 10, 11, 18, 55]
    assert counts(capacity_tiers(1, 100, ladder=ladder_of(config)), HETEROFL) == [6, 10, 11, 18, 55]
    two = RunConfig(backend="local", width_mix="a1-e1")
    assert two.widths == [1.0, 0.0625] and two.width_mix == [1.0, 1.0]
    # with --widths too: the shares follow the widths' order
    ordered = RunConfig(backend="local", widths=[0.0625, 1], width_mix="a1-e3")
    assert ordered.widths == [0.0625, 1.0] and ordered.width_mix == [3.0, 1.0]


def test_dynamic_draws_are_seeded_per_round_from_their_own_stream():
    ladder = ladder_of(RunConfig(backend="local", width_mix="a1-b1-c1-d1-e1"))
    a, b = round_capacities(7, 3, 50, ladder), round_capacities(7, 3, 50, ladder)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, round_capacities(7, 4, 50, ladder))
    assert not np.array_equal(a, round_capacities(8, 3, 50, ladder))
    draws = np.concatenate([round_capacities(7, t, 50, ladder) for t in range(200)])
    assert set(np.unique(draws).tolist()) == set(HETEROFL)
    shares = np.array(counts(draws, HETEROFL)) / len(draws)
    assert np.abs(shares - 0.2).max() < 0.02  # i.i.d. draws from the mix (HeteroFL's "dynamic")
    skewed = ladder_of(RunConfig(backend="local", widths=[1, 0.5], width_mix=[0, 1]))
    assert (round_capacities(7, 0, 50, skewed) == 0.5).all()


@pytest.mark.parametrize("values,match", [
    (dict(widths=[1, 1.5]), r"widths is \[1, 1.5\]; expected a list of widths in \(0, 1\]"),
    (dict(widths=[0, 0.5]), r"widths is \[0, 0.5\]; expected a list of widths in \(0, 1\]"),
    (dict(widths=[]), r"widths is \[\]; expected a list of widths"),
    (dict(widths="1,0.5"), r"widths is '1,0.5'; expected a list of widths"),
    (dict(widths=[0.5, 0.5]), r"gives a width twice; expected distinct widths"),
    (dict(widths=[1, 0.5], width_mix=[1, 1, 1]), r"width_mix is \[1, 1, 1\], 3 shares for 2 widths .*expected 2 "
                                                  "shares, one per width"),
    (dict(width_mix=[1, 1]), r"2 shares for 4 widths \[0.25, 0.5, 0.75, 1.0\]; expected 4 shares"),
    (dict(width_mix="a1-f1"), r"width_mix is 'a1-f1'; expected shares .* or HeteroFL's notation such as "
                              "a1-b1-c1-d1-e1"),
    (dict(width_mix="a-b"), r"width_mix is 'a-b'; expected"),
    (dict(width_mix="a1-a2"), r"names a level twice"),
    (dict(width_mix=[1, -1, 1, 1]), r"expected shares >= 0, not all 0"),
    (dict(width_mix=[0, 0, 0, 0]), r"expected shares >= 0, not all 0"),
    (dict(widths=[1, 0.5], width_mix="a1-c1"), r"whose levels are the widths \[1.0, 0.25\], but widths is \[1, "
                                               r"0.5\]; expected the widths once"),
    (dict(widths=[1, 0.5], tier_counts=[10]), r"tier_counts is \[10\]; expected 2 non-negative client counts for "
                                              r"p\^max 1.0/0.5 adding up to clients \(20\)$"),
    (dict(width_mix=[1, 1, 1, 1], tier_counts=[5, 5, 5, 5]), r"expected one of them"),
    (dict(width_assignment="random"), r"width_assignment is 'random'; expected fixed .* or dynamic"),
])
def test_bad_ladders_are_one_sentence(values, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig(backend="local", **values)


@pytest.mark.parametrize("args,match", [
    (["--widths", "1,half"], "--widths is '1,half'; expected comma-separated widths in (0, 1]"),
    (["--widths", "1,2"], "widths is [1.0, 2.0]; expected a list of widths in (0, 1]"),
    (["--widths", "1,0.5", "--width-mix", "1,1,1"], "3 shares for 2 widths"),
    (["--width-mix", "a1-b1-x1"], "width_mix is 'a1-b1-x1'; expected"),
    (["--width-assignment", "sometimes"], "Invalid value for '--width-assignment'"),
])
def test_bad_ladder_flags_exit_2_in_one_sentence(args, match):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1"] + args)
    assert result.exit_code == 2 and match in result.output and "Traceback" not in result.output


def test_the_flags_show_in_help_and_reach_config_yaml(tmp_path):
    help_text = CliRunner().invoke(main, ["simulate", "--help"]).output
    for flag in ("--widths", "--width-mix", "--width-assignment", "--partition"):
        assert flag in help_text
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--clients", "6", "--clients-per-round",
                                       "3", "--rounds", "1", "--local-epochs", "1", "--width-mix", "a1-e1",
                                       "--width-assignment", "dynamic", "--partition", "iid", "--quiet", "--out",
                                       str(out)])
    assert result.exit_code == 0, result.output
    (tmp_path / "again.yaml").write_text((out / "config.yaml").read_text())  # a run's config.yaml is a config file
    again = CliRunner().invoke(main, ["simulate", "--config", str(tmp_path / "again.yaml"), "--quiet", "--out",
                                      str(tmp_path / "again")])
    assert again.exit_code == 0, again.output
    first, second = (json.loads((d / "summary.json").read_text()) for d in (out, tmp_path / "again"))
    assert first["params_sha256"] == second["params_sha256"]
    stored = RunConfig.from_dict(yaml.safe_load((out / "config.yaml").read_text()))
    assert (stored.widths, stored.width_mix, stored.width_assignment, stored.partition) == \
        ([1.0, 0.0625], [1.0, 1.0], "dynamic", "iid")


def run_recorded(algorithm, **overrides):
    """A tiny digits run recording, per round, every client's p^max and the participants' widths."""
    engine = Engine(RunConfig.from_dict({**TINY, "algorithm": algorithm, **overrides}))
    engine.prepare()
    rounds = []
    allocate = engine.algorithm.allocate

    def recording(t, participants):
        widths = allocate(t, participants)
        rounds.append((engine.p_max.copy(), dict(widths)))
        return widths

    engine.algorithm.allocate = recording
    return engine, rounds, engine.run()


@pytest.mark.parametrize("assignment", ["fixed", "dynamic"])
@pytest.mark.parametrize("algorithm", BUILT_INS)
def test_every_built_in_trains_under_a_custom_ladder(algorithm, assignment):
    assert set(BUILT_INS) <= set(registered("algorithm"))
    engine, rounds, summary = run_recorded(algorithm, widths=HETEROFL, width_mix=[1, 1, 1, 1, 3],
                                           width_assignment=assignment)
    assert len(engine.history) == 3 and np.isfinite(summary["final_accuracy"])
    first = rounds[0][0]
    for p_max, widths in rounds:
        assert set(np.unique(p_max).tolist()) <= set(HETEROFL)
        for client, width in widths.items():
            if algorithm in ("fedavg", "fedprox", "scaffold"):
                assert width == 1.0
            else:  # every sub-model method stays within the round's capacity
                assert width <= p_max[client] + 1e-12
            if algorithm in ("heterofl", "fedrolex", "fjord"):
                assert width == p_max[client]
            if algorithm == "uniform":
                assert width == min(0.5, p_max[client])
        if assignment == "fixed":
            np.testing.assert_array_equal(p_max, first)
    if assignment == "dynamic":
        assert any(not np.array_equal(p, first) for p, _ in rounds)
        assert list(summary["accuracy_at_width_final"]) == ["0.0625", "0.125", "0.25", "0.5", "1"]
    if algorithm == "fjord":  # FjORD samples the ladder's widths, not the paper's tiers
        assert set(engine.algorithm.tiers) <= set(HETEROFL)


def test_dynamic_reports_the_last_rounds_capacities_per_tier(tmp_path):
    engine = Engine(RunConfig(**{**TINY, "rounds": 2}, algorithm="heterofl", width_mix="a1-c1-e1",
                              width_assignment="dynamic"), out_dir=str(tmp_path / "run"))
    summary = engine.run()
    last = round_capacities(3, 1, 6, ladder_of(engine.config))
    with open(tmp_path / "run" / "clients.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [float(r["p_max"]) for r in rows] == last.tolist()
    assert [float(r["p_final"]) for r in rows] == last.tolist()  # heterofl trains its round's capacity
    assert set(summary["local_accuracy"]["per_tier"]) == {f"{w:g}" for w in np.unique(last)}


def test_dynamic_resume_is_bit_identical(tmp_path):
    """Two rounds, checkpointed, then continued to four: the capacities and HAS-FL's state pick up where they were."""
    ladder = dict(algorithm="hasfl", width_mix="a1-b1-c2", width_assignment="dynamic")
    reference = Engine(RunConfig(**{**TINY, "rounds": 4}, **ladder), out_dir=str(tmp_path / "reference")).run()
    out = str(tmp_path / "run")
    Engine(RunConfig(**{**TINY, "rounds": 2, "checkpoint_every": 2}, **ladder), out_dir=out).run()
    resumed = Engine(RunConfig(**{**TINY, "rounds": 4}, **ladder), out_dir=out, resume=True, force=True).run()
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert resumed["local_accuracy"] == reference["local_accuracy"]


def test_the_tier_counts_example_is_never_the_value_refused():
    """h60: tier_counts [4, 10, 3, 3] for 10 clients was refused "expected ... adding up to clients (10), e.g.
    [4, 10, 3, 3] for 20": the refused value as the example. The example now adds up to this run's clients."""
    with pytest.raises(ConfigError) as refused:
        RunConfig(backend="local", clients=10, clients_per_round=3, tier_counts=[4, 10, 3, 3])
    message = str(refused.value)
    assert message.startswith("tier_counts is [4, 10, 3, 3]; expected 4 non-negative client counts")
    assert message.endswith("adding up to clients (10), e.g. [3, 3, 2, 2]") and message.count("[4, 10, 3, 3]") == 1
    with pytest.raises(ConfigError, match=r"adding up to clients \(20\), e.g. \[4, 10, 3, 3\] \(the paper's runs\)$"):
        RunConfig(backend="local", clients=20, tier_counts=[4, 10, 3])
