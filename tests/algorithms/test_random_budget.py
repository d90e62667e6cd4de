"""Random-budget: widths ≤ p_max drawn to a budget, HAS-FL's coverage rule and schedule, avg_p within ±0.03."""

import json

import numpy as np
import pytest
import torch

from algorithm_runs import LEARNING_RUN, P_MAX_4, SAMPLES_4, recorded_run, small_config
from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.algorithms.random_budget import RandomBudget, budget_range, default_budget, random_allocation
from hasfl_ray.data import assign_tiers
from hasfl_ray.config import RunConfig
from hasfl_ray.schedule import first_adapted_round, post_warmup_avg_p
from hasfl_ray.engine.engine import sample_participants
from hasfl_ray.training.seeding import STREAM_TIERS
from hasfl_ray.errors import ConfigError
from hasfl_ray.training.local import ClientResult
from hasfl_ray.training.seeding import numpy_rng

EMPTY = AggregateResult({}, torch.zeros(0), torch.zeros(0), 1.0)


def test_random_allocation_hand_computed():
    # equal factors: p = clip(L, 0.25, p_max), top tier at 1; mean 0.6 needs 0.25 + 0.5 + L + 1 = 2.4, L = 0.65
    p = random_allocation(np.ones(4), P_MAX_4, 0.6, coverage=True)
    np.testing.assert_allclose(p, [0.25, 0.5, 0.65, 1.0], atol=1e-9)
    # no coverage, factors [1, 1, 1, 0.5]: 0.25 + min(L, .5) + min(L, .75) + clip(L / 2, .25, 1) = 2 at L = 1
    p = random_allocation(np.array([1.0, 1.0, 1.0, 0.5]), P_MAX_4, 0.5, coverage=False)
    np.testing.assert_allclose(p, [0.25, 0.5, 0.75, 0.5], atol=1e-9)
    assert budget_range(P_MAX_4, coverage=True) == (pytest.approx(0.4375), pytest.approx(0.625))
    assert budget_range(P_MAX_4, coverage=False) == (pytest.approx(0.25), pytest.approx(0.625))


def simulate(seed, budget, rounds=200, warmup=10, t_adapt=5, clients=20, per_round=10, coverage=True):
    """Allocate/observe without training (random-budget ignores the aggregate); returns realised avg_p."""
    p_max = assign_tiers(clients, numpy_rng(seed, STREAM_TIERS))
    config = RunConfig.from_dict(dict(backend="local", rounds=rounds, seed=seed, algorithm="random-budget", budget=budget, warmup=warmup,
                       t_adapt=t_adapt, coverage=coverage, clients=clients, clients_per_round=per_round)).resolved()
    algorithm = RandomBudget(config, p_max, np.full(clients, 50))
    per_round_means, allocations = [], []
    for t in range(rounds):
        widths = algorithm.allocate(t, sample_participants(seed, t, clients, per_round))
        per_round_means.append(np.mean(list(widths.values())))
        allocations.append(algorithm.p_current.copy())
        assert all(0 < w <= p_max[i] + 1e-12 for i, w in widths.items())
        if coverage:
            assert all(w == p_max[i] for i, w in widths.items() if p_max[i] == p_max.max())
        algorithm.observe(t, [ClientResult(i, w, {}, 50, 0.0, 1) for i, w in widths.items()], EMPTY)
    return post_warmup_avg_p(per_round_means, warmup, t_adapt), allocations, p_max


@pytest.mark.parametrize("seed, budget", [(42, 0.52), (43, 0.45), (44, 0.40), (7, 0.49)])
def test_realised_avg_p_meets_the_budget_under_the_paper_protocol(seed, budget):
    realised, allocations, p_max = simulate(seed, budget)
    assert abs(realised - budget) <= 0.03
    # HAS-FL's schedule: p^max up to the first adaptation (end of round 10), a new draw after each one only
    assert all(np.array_equal(a, p_max) for a in allocations[:11])
    changes = [t for t in range(1, 200) if not np.array_equal(allocations[t], allocations[t - 1])]
    assert changes and all(t - 1 >= 10 and (t - 1) % 5 == 0 for t in changes)
    assert len(changes) > 30  # time-varying


def test_short_runs_still_meet_the_budget():
    realised, _, _ = simulate(3, 0.42, rounds=12, warmup=1, t_adapt=1)
    assert abs(realised - 0.42) <= 0.03


def test_budget_outside_what_the_federation_can_average_is_refused(config4):
    with pytest.raises(ConfigError, match=r"budget is 0\.7 but random widths .* between 0\.4375 and 0\.6250"):
        RandomBudget(small_config(algorithm="random-budget", budget=0.7), P_MAX_4, SAMPLES_4)


def test_first_adapted_round_follows_hasfls_schedule():
    assert first_adapted_round(10, 5) == 11  # the block runs at the end of round 10
    assert first_adapted_round(11, 5) == 16 and first_adapted_round(0, 3) == 1 and first_adapted_round(1, 1) == 2
    assert post_warmup_avg_p([1.0] * 11 + [0.5, 0.3], 10, 5) == pytest.approx(0.4)
    assert post_warmup_avg_p([1.0] * 11, 10, 5) is None


@pytest.mark.parametrize("dataset", ["digits", "emnist", "cifar10", "shakespeare", "synthetic"])
@pytest.mark.parametrize("clients", [4, 20, 100])
def test_the_default_budget_is_feasible_on_every_dataset(dataset, clients):
    config = RunConfig(backend="local", algorithm="random-budget", dataset=dataset, clients=clients,
                       clients_per_round=min(clients, 10)).resolved()
    low, high = budget_range(assign_tiers(clients, numpy_rng(42, STREAM_TIERS)), coverage=True)
    assert low <= config.algorithm_options["budget"] <= high
    # 20 clients (8/5/4/3 at 0.25/0.5/0.75/1): 0.25·8 + 0.5·5 + 0.65·4 + 1·3 = 10.1 over 20
    assert clients != 20 or config.algorithm_options["budget"] == 0.505
    assert default_budget(P_MAX_4, 0.4, 0.25, coverage=True) == pytest.approx((0.25 + 0.5 + 0.65 + 1) / 4)


def test_budget_from_reads_the_runs_post_warmup_avg_p(tmp_path):
    assert "budget" not in RunConfig(backend="local", algorithm="hasfl").resolved().algorithm_options
    run = tmp_path / "hasfl-run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"avg_p": 0.4871, "best_accuracy": 0.5}))  # an older summary
    assert RunConfig.from_dict(dict(backend="local", algorithm="random-budget", budget_from=str(run))).resolved().algorithm_options["budget"] == 0.4871
    (run / "summary.json").write_text(json.dumps({"avg_p": 0.4871, "avg_p_post_warmup": 0.4712}))
    config = RunConfig.from_dict(dict(backend="local", algorithm="random-budget", budget_from=str(run))).resolved()
    assert config.algorithm_options["budget"] == 0.4712 and config.algorithm_options["budget_from"] == str(run)
    assert RunConfig.from_dict(dict(backend="local", algorithm="random-budget", budget_from=str(run), budget=0.45)).resolved().algorithm_options["budget"] == 0.45


def test_an_infeasible_budget_from_a_run_is_clamped_with_one_warning(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"avg_p": 0.9, "avg_p_post_warmup": 0.7}))
    config = small_config(algorithm="random-budget", budget_from=str(run))
    assert config.algorithm_options["budget"] == 0.7
    with caplog.at_level("WARNING"):
        algorithm = RandomBudget(config, P_MAX_4, SAMPLES_4)
    assert algorithm.budget == pytest.approx(0.625)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "0.7000" in warnings[0] and "0.6250" in warnings[0]


def test_hasfl_then_random_budget_from_its_run_match_after_warmup(tmp_path):
    """The paper's control as a user runs it: same seed, budget read from the HAS-FL run directory."""
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    common = ["simulate", "--backend", "local", "--rounds", "26", "--seed", "43", "--quiet"]
    runner = CliRunner()
    hasfl = runner.invoke(main, common + ["--out", str(tmp_path / "hasfl")])
    assert hasfl.exit_code == 0, hasfl.output
    control = runner.invoke(main, common + ["--algorithm", "random-budget", "--budget-from", str(tmp_path / "hasfl"),
                                            "--out", str(tmp_path / "control")])
    assert control.exit_code == 0, control.output
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("hasfl", "control")]
    assert all(s["avg_p_post_warmup"] is not None for s in summaries)
    assert abs(summaries[0]["avg_p_post_warmup"] - summaries[1]["avg_p_post_warmup"]) <= 0.02


@pytest.mark.parametrize("content, needle", [
    (None, "has no summary.json"),
    ("{not json", "is not valid JSON"),
    ('{"rounds": 3}', "has avg_p None"),
    ('{"avg_p": 1.7}', "has avg_p 1.7"),
])
def test_budget_from_a_bad_run_directory_is_one_sentence(tmp_path, content, needle):
    if content is not None:
        (tmp_path / "summary.json").write_text(content)
    with pytest.raises(ConfigError, match=needle) as info:
        RunConfig.from_dict(dict(backend="local", algorithm="random-budget", budget_from=str(tmp_path))).resolved()
    assert "\n" not in str(info.value) and "expected" in str(info.value)


def test_engine_run_lands_on_its_budget():
    run = recorded_run(algorithm="random-budget", budget=0.42, **LEARNING_RUN)
    realised = post_warmup_avg_p([line["avg_p"] for line in run.history], LEARNING_RUN["warmup"],
                                 LEARNING_RUN["t_adapt"])
    assert abs(realised - 0.42) <= 0.03
    p_max = run.engine.p_max
    for widths in run.widths:
        assert all(w <= p_max[i] for i, w in widths.items())
        assert all(w == 1.0 for i, w in widths.items() if p_max[i] == 1.0)
