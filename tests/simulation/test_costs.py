"""The Ray backend's cost model of a round's units (hasfl_ray/simulation/costs.py): steps, the width-squared term,
the fit from reported call seconds, and what a plan of calls gets from it. No Ray needed."""

import math
import random

from hasfl_ray.simulation.backend import calls
from hasfl_ray.simulation.costs import MAX_RATIO, MIN_CALLS, PRIOR_RATIO, CostModel
from hasfl_ray.training.task import ClientTask

SIZES = {0: 14, 1: 163, 2: 64, 3: 65, 4: 30}


def task(client, width, max_steps=None):
    return ClientTask(client=client, round=0, width=width, lr=0.1, seed=0, max_steps=max_steps)


def test_steps_follow_the_epochs_batches_local_steps_and_a_deadlines_cap():
    model = CostModel(SIZES.get, batch_size=32, local_epochs=2, local_steps=None)
    assert model.steps(task(0, 1.0)) == 2  # 14 samples: one batch an epoch
    assert model.steps(task(1, 1.0)) == 12  # 163: six batches an epoch
    assert model.steps(task(1, 1.0, max_steps=5)) == 5
    fixed = CostModel(SIZES.get, batch_size=32, local_epochs=2, local_steps=7)
    assert fixed.steps(task(1, 1.0)) == 7 and fixed.steps(task(0, 0.5)) == 7
    assert fixed.steps(task(1, 1.0, max_steps=3)) == 3


def test_a_units_terms_alone_batched_and_mixed():
    model = CostModel(SIZES.get, batch_size=32, local_epochs=1, local_steps=None)
    tasks = [task(1, 0.5), task(2, 0.5), task(3, 1.0)]  # 6, 2 and 3 steps
    assert model.features(tasks, [0], "off") == (6.0, 6 * 0.25)
    assert model.features(tasks, [0, 1], "off") == (8.0, 8 * 0.25)
    # batched: the group steps together (its fixed price once, for its longest client)
    assert model.features(tasks, [0, 1], "on") == (6.0, 8 * 0.25)
    # mixed: every client at the widest width
    assert model.features(tasks, [0, 2], "mixed") == (6.0, 9 * 1.0)


def test_the_prior_holds_until_enough_calls_then_the_fit_recovers_the_two_prices():
    model = CostModel(SIZES.get, batch_size=32, local_epochs=1, local_steps=None)
    a, b = 3.0, 0.5  # seconds per step, and per step at width 1 of the width-squared part
    rng = random.Random(0)
    points = [(float(rng.randint(2, 40)), rng.uniform(0.05, 30.0)) for _ in range(20)]
    for i, (f1, f2) in enumerate(points):
        assert model.ratio == (PRIOR_RATIO if i < MIN_CALLS else model.ratio)
        model.observe((f1, f2), a * f1 + b * f2)
    assert math.isclose(model.ratio, a / b, rel_tol=1e-9)
    assert model.costs([(2.0, 4.0)]) == [model.ratio * 2.0 + 4.0]


def test_a_fit_that_cannot_tell_the_terms_apart_or_comes_out_negative_stays_in_bounds():
    alike = CostModel(SIZES.get, batch_size=32, local_epochs=1, local_steps=None)
    for _ in range(MIN_CALLS + 2):
        alike.observe((4.0, 2.0), 1.0)  # every call the same: a and b cannot be separated
    assert alike.ratio == PRIOR_RATIO
    width_free = CostModel(SIZES.get, batch_size=32, local_epochs=1, local_steps=None)
    for f1, f2 in [(2.0, 1.0), (4.0, 9.0), (8.0, 2.0), (3.0, 7.0), (5.0, 1.0)]:
        width_free.observe((f1, f2), 1.0 * f1 - 0.1 * f2)  # a negative width price: steps alone decide
    assert math.isclose(width_free.ratio, MAX_RATIO)
    no_steps = CostModel(SIZES.get, batch_size=32, local_epochs=1, local_steps=None)
    for f1, f2 in [(2.0, 1.0), (4.0, 9.0), (8.0, 2.0), (3.0, 7.0), (5.0, 1.0)]:
        no_steps.observe((f1, f2), -0.2 * f1 + 1.0 * f2)
    assert no_steps.ratio == 0.0
    ignored = CostModel(SIZES.get, batch_size=32, local_epochs=1, local_steps=None)
    ignored.observe((1.0, 1.0), float("nan"))
    ignored.observe((1.0, 1.0), 0.0)
    assert ignored.calls == 0


def test_a_plan_by_steps_and_width_evens_out_clients_the_width_squared_term_alone_misjudges():
    # digits-like clients whose step costs as much as the width-squared arithmetic at width 1: narrow clients with
    # many steps, wide ones with few
    widths = [0.25, 0.25, 0.25, 0.25, 1.0, 1.0, 1.0, 0.5]
    steps = [12, 12, 12, 12, 3, 3, 3, 6]
    seconds = [s * (1.0 + w * w) for s, w in zip(steps, widths)]
    units = [[k] for k in range(len(widths))]

    def spread(costs):
        loads = [sum(seconds[k] for unit, _ in call for k in unit) for call in calls(units, costs, trainers=2)]
        return max(loads) - min(loads)

    old = spread([s * w * w for s, w in zip(steps, widths)])
    new = spread([s * (PRIOR_RATIO + w * w) for s, w in zip(steps, widths)])
    assert old == 27.0 and new == 1.5  # the trainers 24.75 / 51.75 s apart before, 39 / 37.5 s now


def test_absolute_seconds_of_units_and_of_evaluations_once_measured():
    model = CostModel(SIZES.get, batch_size=32, local_epochs=1, local_steps=None)
    assert model.seconds([(2.0, 1.0)]) is None and model.evaluation_seconds("evaluate", 1.0) is None
    for f1, f2 in [(2.0, 1.0), (4.0, 9.0), (8.0, 2.0), (3.0, 7.0)]:
        model.observe((f1, f2), 0.002 * f1 + 0.004 * f2)
    assert [round(x, 9) for x in model.seconds([(10.0, 5.0)])] == [0.04]
    model.observe_evaluation("evaluate_widths", 1.3, 0.013)
    model.observe_evaluation("evaluate_widths", 1.0, 0.007)
    model.observe_evaluation("evaluate_widths", 0.0, 5.0)  # nothing evaluated: ignored
    model.observe_evaluation("evaluate", 1.0, 0.5)  # another method: its own price
    assert math.isclose(model.evaluation_seconds("evaluate_widths", 2.0), 2.0 * 0.020 / 2.3)
    assert model.evaluation_seconds("evaluate", 2.0) == 1.0 and model.evaluation_seconds("test_logits", 1.0) is None


def test_a_plan_with_each_trainers_evaluations_preloaded_gives_call_i_to_trainer_i():
    units = [[k] for k in range(6)]
    costs = [4.0, 4.0, 3.0, 3.0, 2.0, 2.0]
    # trainer 0 already evaluates for 6 s: it gets less training, and its call comes first
    planned = calls(units, costs, trainers=2, preload=[6.0, 0.0])
    trained = [sum(costs[k] for unit, _ in call for k in unit) for call in planned]
    loads = [6.0 + trained[0], trained[1]]
    assert sorted(k for call in planned for unit, _ in call for k in unit) == list(range(6))
    assert abs(loads[0] - loads[1]) <= 2.0, loads
    assert trained[0] < trained[1]
    # a trainer with more than the whole round to evaluate gets no unit: its call is empty, in its place
    assert calls(units, costs, trainers=2, preload=[100.0, 0.0])[0] == []
    # several calls per trainer: no preload (the driver evens out the loads as calls finish)
    many = [[k] for k in range(40)]
    assert calls(many, [1.0] * 40, trainers=2, preload=[5.0, 0.0]) == calls(many, [1.0] * 40, trainers=2)
