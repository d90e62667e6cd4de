"""HAS-FL: the allocation rule and coverage guarantee on hand-computed cases, and the EMA / warm-up / T_norm schedule."""

import numpy as np
import pytest
import torch

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.algorithms.hasfl import HASFL, allocation_rule, coverage_guarantee
from hasfl_ray.training.local import ClientResult
from algorithm_runs import LEARNING_RUN, P_MAX_4, SAMPLES_4, mask_fraction, recorded_run


def fake_round(clients, h_hat):
    """Accepted results of ``clients`` and an aggregate whose estimator gives exactly ``h_hat``."""
    results = [ClientResult(c, 1.0, {}, 10, 0.0, 1) for c in clients]
    num = torch.tensor(h_hat, dtype=torch.float64)
    return results, AggregateResult({}, num, torch.ones(len(clients), dtype=torch.float64) - 1e-8, 1.0)


def test_allocation_rule_hand_computed():
    h = np.array([1.0, 2.0, 3.0, 6.0])  # mean 3
    p = allocation_rule(h, P_MAX_4, p_min=0.4, gamma=0.25, epsilon=0.0)
    # 0.4 + 0.25 * h / 3 = [0.4833, 0.5667, 0.65, 0.9], then min with p_max
    np.testing.assert_allclose(p, [0.25, 0.5, 0.65, 0.9])
    np.testing.assert_allclose(coverage_guarantee(p, P_MAX_4), [0.25, 0.5, 0.65, 1.0])
    # gamma = 0 is uniform allocation at p_min (within capacity)
    np.testing.assert_allclose(allocation_rule(h, P_MAX_4, 0.4, 0.0, 0.0), [0.25, 0.4, 0.4, 0.4])


def test_coverage_guarantee_lifts_every_client_of_the_top_tier_only():
    p_max = np.array([0.5, 0.75, 0.75, 0.25])  # no full-capacity client: 0.75 is the top
    p = np.array([0.4, 0.45, 0.6, 0.25])
    np.testing.assert_allclose(coverage_guarantee(p, p_max), [0.4, 0.75, 0.75, 0.25])
    assert coverage_guarantee(p, p_max) is not p  # the input is not modified


def test_warmup_ema_and_adaptation_schedule(config4):
    algorithm = HASFL(config4, P_MAX_4, SAMPLES_4)  # warmup 10, t_adapt 5, beta 0.9
    assert algorithm.allocate(0, [0, 3]) == {0: 0.25, 3: 1.0}  # p^(0) = p^max
    adaptation_rounds = [t for t in range(40) if algorithm.is_adaptation_round(t)]
    assert adaptation_rounds == [10, 15, 20, 25, 30, 35]
    results, aggregate = fake_round([1, 2], [3.0, 5.0])
    for t in range(10):  # warm-up: estimates are ignored, allocations stay at p^max
        algorithm.observe(t, results, aggregate)
    np.testing.assert_allclose(algorithm.h_tilde(), [1, 1, 1, 1])
    np.testing.assert_allclose(algorithm.p_current, P_MAX_4)
    algorithm.observe(10, results, aggregate)
    h = np.array([1.0, 0.9 + 0.1 * 3.0, 0.9 + 0.1 * 5.0, 1.0])  # EMA for the participants only
    np.testing.assert_allclose(algorithm.h_tilde(), h, rtol=1e-7)
    expected = coverage_guarantee(allocation_rule(h, P_MAX_4, 0.4, 0.25, 1e-8), P_MAX_4)
    np.testing.assert_allclose(algorithm.p_current, expected)
    np.testing.assert_allclose(algorithm.p_current, [0.25, 0.5, 0.4 + 0.25 * 1.4 / 1.15, 1.0], rtol=1e-6)
    algorithm.observe(11, results, aggregate)  # not an adaptation round
    np.testing.assert_allclose(algorithm.h_tilde(), h, rtol=1e-7)


def test_normalisation_every_t_norm_rounds_keeps_order(config4):
    algorithm = HASFL(config4, P_MAX_4, SAMPLES_4)
    results, aggregate = fake_round([0, 1, 2], [4.0, 9.0, 0.5])
    for t in range(20):
        algorithm.observe(t, results, aggregate)
    assert algorithm.h_tilde().mean() > 1.05  # adaptation at t = 10 and 15 raised the mean; not rescaled at 19
    twin = HASFL(config4, P_MAX_4, SAMPLES_4)
    twin.load_state_dict(algorithm.state_dict())
    algorithm.observe(20, results, aggregate)  # t = 20: adapt, then rescale to mean 1 (the paper's Figure 4)
    after = algorithm.h_tilde()
    assert after.mean() == pytest.approx(1.0)
    h = twin.h_tilde()
    for client, estimate in zip([0, 1, 2], [4.0, 9.0, 0.5]):  # the round's EMA, before the rescale
        h[client] = 0.9 * h[client] + 0.1 * estimate
    np.testing.assert_allclose(after, h / h.mean())
    assert list(np.argsort(after)) == list(np.argsort(h))
    algorithm.observe(21, results, aggregate)
    assert algorithm.h_tilde().mean() == pytest.approx(1.0)  # no adaptation at 21: still 1


def test_state_round_trips(config4):
    algorithm = HASFL(config4, P_MAX_4, SAMPLES_4)
    results, aggregate = fake_round([0, 2], [2.0, 7.0])
    for t in range(12):
        algorithm.observe(t, results, aggregate)
    clone = HASFL(config4, P_MAX_4, SAMPLES_4)
    clone.load_state_dict(algorithm.state_dict())
    np.testing.assert_array_equal(clone.h_tilde(), algorithm.h_tilde())
    np.testing.assert_array_equal(clone.p_current, algorithm.p_current)


def test_hasfl_with_coverage_never_freezes_once_a_top_tier_client_trained():
    run = recorded_run(algorithm="hasfl", **LEARNING_RUN)
    seen_full = False
    for widths, line in zip(run.widths, run.history):
        seen_full = seen_full or max(widths.values()) == 1.0
        if seen_full:  # a handful of coordinates may round their update away in float32 for a round
            assert line["frozen_fraction"] < 1e-4
    assert seen_full and run.history[-1]["frozen_fraction"] == 0.0


def _seed_without_top_tier_in_round_0():
    from hasfl_ray.data import assign_tiers
    from hasfl_ray.engine.engine import sample_participants
    from hasfl_ray.training.seeding import STREAM_TIERS
    from hasfl_ray.training.seeding import numpy_rng

    for seed in range(100):
        p_max = assign_tiers(20, numpy_rng(seed, STREAM_TIERS))
        if max(p_max[sample_participants(seed, 0, 20, 10)]) < 1.0:
            return seed
    raise AssertionError("no seed in range(100) leaves the top tier out of round 0")


def test_no_coverage_ablation_freezes_what_no_allocation_reaches():
    """--no-coverage: once allocations cap below the top tier, the rest stays at w^(0) (Proposition 1)."""
    seed = _seed_without_top_tier_in_round_0()
    run = recorded_run(algorithm="hasfl", coverage=False, seed=seed, rounds=4, warmup=0, t_adapt=1, gamma=0.02)
    assert max(run.engine.algorithm.p_current) < 1.0  # every allocation capped below the top tier
    widest = 0.0
    for widths, line in zip(run.widths, run.history):
        widest = max(widest, *widths.values())
        assert widest < 1.0
        assert line["frozen_fraction"] == pytest.approx(1 - mask_fraction(widest), abs=1e-9)
    assert run.history[-1]["frozen_fraction"] > 0


def test_mean_h_is_one_right_after_rounds_20_and_40_in_metrics(tmp_path):
    """The run directory's mean_h: exactly 1 after rounds 20 and 40 (the paper's T_norm), above 1 between."""
    import json

    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "41", "--clients", "6",
                                       "--clients-per-round", "3", "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    mean_h = {line["round"]: line["mean_h"] for line in map(json.loads, (out / "metrics.jsonl").open())}
    assert mean_h[20] == pytest.approx(1.0, abs=1e-12) and mean_h[40] == pytest.approx(1.0, abs=1e-12)
    assert mean_h[19] != pytest.approx(1.0) and mean_h[39] != pytest.approx(1.0)
    assert all(mean_h[t] == 1.0 for t in range(10))  # warm-up: H̃ untouched
