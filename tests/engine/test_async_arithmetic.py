"""Values at the ends of the doubles in the asynchronous arithmetic are computed safely (issue 49 item 3; hostile
battery 5 problems 12, 13): an evaluation period of 5e-324 s never overflows (every later update crosses one of its
multiples), and a staleness function whose factor underflows leaves that update out of the mean (it counts for
nothing) while a subnormal one reaches the kernel scaled by a power of two, never a division by zero."""

import json
import math

import pytest
from click.testing import CliRunner

from hasfl_ray.aggregation.asynchronous import TINY_WEIGHT, buffered_step, kernel_weights, mixing_step
from hasfl_ray.cli.main import main
from hasfl_ray.config.asynchronous import eval_due, staleness_factor
from hasfl_ray.engine import Engine, RunConfig

ASYNC = dict(backend="local", mode="async", devices="lognormal", clients=10, clients_per_round=4, concurrency=4,
             buffer_size=2, local_epochs=1, seed=5, rounds=4)


@pytest.mark.parametrize("seconds", [5e-324, 1e-310, 1e-300])
def test_eval_due_with_the_smallest_periods_never_overflows(seconds):
    assert eval_due(0, False, 0.25, 0.0, None, seconds)  # a later update crosses a multiple
    assert not eval_due(0, False, 0.25, 0.25, None, seconds)  # no time passed: none crossed
    assert eval_due(0, False, 1e300, 0.5, None, seconds)


def test_eval_due_is_unchanged_for_everyday_periods():
    assert [eval_due(v, False, t, t - 0.4, None, 1.0) for v, t in enumerate([0.5, 0.9, 1.2, 1.5, 2.0])] == \
        [math.floor(t / 1.0) > math.floor((t - 0.4) / 1.0) for t in [0.5, 0.9, 1.2, 1.5, 2.0]]


def test_an_evaluation_period_of_5e_324_seconds_evaluates_every_update(tmp_path):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--mode", "async", "--devices", "lognormal",
                                       "--eval-every-seconds", "5e-324", "--rounds", "3", "--clients", "10",
                                       "--clients-per-round", "4", "--quiet", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as handle:
        assert all(json.loads(line)["test_accuracy"] is not None for line in handle)


def test_kernel_weights_are_the_same_unless_tiny_and_then_scaled_exactly():
    assert kernel_weights([3.0, 0.25, 1e-300]) == [3.0, 0.25, 1e-300]
    assert kernel_weights([TINY_WEIGHT]) == [TINY_WEIGHT]
    tiny = [2.0 ** -1070, 3 * 2.0 ** -1072, 0.0]
    scaled = kernel_weights(tiny)
    assert 0.5 <= max(scaled) < 1 and scaled[2] == 0.0
    assert scaled[1] / scaled[0] == 0.75  # the ratios exactly
    weights, lr = buffered_step([40, 40], [2.0 ** -1070, 2.0 ** -1071], 1.0)
    assert weights == [0.625, 0.3125] and lr == (40 * 2.0 ** -1070 + 40 * 2.0 ** -1071) / 80  # the true step
    assert mixing_step(40, 2.0 ** -1070, 0.6, 1.0)[0] == [0.625]


@pytest.mark.parametrize("staleness", ["polynomial:1e300", "hinge:1e308,0", "polynomial:1070"])
@pytest.mark.parametrize("rule", ["fedbuff", "fedasync"])
def test_a_staleness_factor_at_the_end_of_the_doubles_is_computed_safely(caplog, staleness, rule):
    extra = {"buffer_size": None} if rule == "fedasync" else {"buffer_size": 1}
    keys = {**ASYNC, **extra, "async_rule": rule, "concurrency": 6, "staleness": staleness, "rounds": 6}
    summary = Engine(RunConfig(**keys)).run()
    assert summary["server_updates"] == 6 and math.isfinite(summary["final_accuracy"])
    zero = [r.message for r in caplog.records if "is 0 in floating point" in r.message]
    assert zero and "so their updates count for nothing" in zero[0]


def test_a_subnormal_factor_gives_a_finite_mean():
    """polynomial:1070 gives s(1) = 2^-1070 (subnormal): a buffer of such updates is their mean (weights scaled
    exactly), never the division by a subnormal sum that made the global model NaN (the run ended in an error)."""
    assert staleness_factor("polynomial", (1070.0,), 1) == 2.0 ** -1070 > 0
    summary = Engine(RunConfig(**{**ASYNC, "concurrency": 6, "buffer_size": 2, "staleness": "polynomial:1070",
                                  "rounds": 6})).run()
    assert summary["updates_applied"] == 12 and math.isfinite(summary["best_accuracy"])
