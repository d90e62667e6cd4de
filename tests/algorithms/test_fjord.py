"""FjORD: the widths each client samples, their distribution, the nested forward pass and avg_p."""

import numpy as np
import pytest
import torch

from algorithm_runs import LEARNING_RUN, P_MAX_4, SAMPLES_4, recorded_run, small_config
from hasfl_ray.algorithms.fjord import FjORD, OrderedDropoutObjective, nested_parameters
from hasfl_ray.data import load_dataset
from hasfl_ray.models import build_model, extract, insert_, region
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer


def test_each_client_samples_the_tiers_up_to_its_capacity(config4):
    algorithm = FjORD(small_config(algorithm="fjord"), P_MAX_4, SAMPLES_4)
    assert [algorithm.widths_for(i) for i in range(4)] == [
        [0.25], [0.25, 0.5], [0.25, 0.5, 0.75], [0.25, 0.5, 0.75, 1.0]]
    assert algorithm.allocate(0, [1, 3]) == {1: 0.5, 3: 1.0}  # each trains its p_max model
    objective = algorithm.objective(4, 3, 1.0)
    assert objective.widths == [0.25, 0.5, 0.75, 1.0] and objective.distill_weight == 1.0


def test_sampled_widths_are_uniform_over_the_tiers_and_seeded(config4):
    algorithm = FjORD(small_config(algorithm="fjord"), P_MAX_4, SAMPLES_4)

    def draws(round, client, n=4000):
        objective = algorithm.objective(round, client, float(P_MAX_4[client]))
        objective.setup(None, {}, float(P_MAX_4[client]), torch.Generator())
        return [objective.sample_width() for _ in range(n)]

    sample = draws(0, 3)
    counts = {w: sample.count(w) / len(sample) for w in (0.25, 0.5, 0.75, 1.0)}
    assert sum(counts.values()) == 1.0
    assert all(abs(f - 0.25) < 0.03 for f in counts.values()), counts
    assert np.mean(sample) == pytest.approx(0.625, abs=0.02)
    assert set(draws(0, 1, 200)) == {0.25, 0.5}
    assert draws(2, 3, 50) == draws(2, 3, 50)  # seeded by (seed, round, client)
    assert draws(2, 3, 50) != draws(3, 3, 50)


@pytest.mark.parametrize("model_name, inputs", [
    ("digits", lambda: torch.randn(6, 1, 8, 8)),
    ("shakespeare", lambda: torch.randint(0, 95, (3, 12))),
])
def test_nested_forward_equals_the_physically_smaller_model(model_name, inputs):
    torch.manual_seed(0)
    wide = build_model(model_name, 0.75)
    x = inputs()
    for width in (0.25, 0.5):
        nested = torch.func.functional_call(build_model(model_name, width), nested_parameters(wide, width), (x,))
        small = build_model(model_name, width)
        params = dict(wide.named_parameters())
        specs = wide.param_specs()
        with torch.no_grad():
            for name, param in small.named_parameters():
                param.copy_(extract(params[name], specs[name], width))
        torch.testing.assert_close(nested, small(x))


def test_trainer_reports_the_mean_sampled_width():
    dataset = load_dataset("digits", 20, 0.3, 42)
    trainer = Trainer(dataset, "digits", OptimizerSettings(local_epochs=2))
    objective = OrderedDropoutObjective([0.25, 0.5, 0.75], 1.0, seed=11)
    global_params = {name: p.detach().clone() for name, p in build_model("digits").named_parameters()}
    result = trainer.train(ClientTask(5, 0, 0.75, 0.05, 42, objective), global_params)
    sampled = result.extras["sampled_widths"]
    assert len(sampled) == result.steps and set(sampled) <= {0.25, 0.5, 0.75}
    assert result.trained_width == pytest.approx(np.mean(sampled))
    spec = build_model("digits").param_specs()["fc1.weight"]
    assert tuple(result.update["fc1.weight"].shape) == spec.sliced_shape(0.75)  # uploads its p_max model


def test_avg_p_is_the_mean_sampled_width_below_the_capacity_it_trains():
    run = recorded_run(algorithm="fjord", **LEARNING_RUN)
    for widths, line in zip(run.widths, run.history):
        assert line["avg_p"] <= np.mean(list(widths.values()))  # sampled ≤ p_max, strictly on average
    assert np.mean([line["avg_p"] for line in run.history]) < np.mean([np.mean(list(w.values())) for w in run.widths])
    # the protocol's tiers give an expected sampled width of 0.3875 (the paper reports 0.40-0.41)
    assert 0.3 < np.mean([line["avg_p"] for line in run.history]) < 0.5


@pytest.mark.parametrize("model_name, inputs, labels", [
    ("digits", lambda: torch.randn(6, 1, 8, 8), lambda: torch.randint(0, 10, (6,))),
    ("shakespeare", lambda: torch.randint(0, 95, (3, 12)), lambda: torch.randint(0, 95, (3,))),
])
def test_without_kd_each_step_trains_the_drawn_width_alone(model_name, inputs, labels):
    """fjord_kd false: a step is SGD on the drawn width's cross-entropy, checked against a float64 reference that
    trains the physically smaller model and writes it back; coordinates outside the drawn width stay put."""
    torch.manual_seed(1)
    wide, lr, steps = build_model(model_name, 0.75), 0.1, 8
    start = {name: p.detach().clone() for name, p in wide.named_parameters()}
    reference = {name: p.double() for name, p in start.items()}
    specs = wide.param_specs()
    objective = OrderedDropoutObjective([0.25, 0.5, 0.75], 1.0, seed=3, kd=False)
    objective.setup(wide, {}, 0.75, torch.Generator(), model_at=lambda w: build_model(model_name, w))
    optimizer = torch.optim.SGD(wide.parameters(), lr=lr)
    for _ in range(steps):
        x, y = inputs(), labels()
        before = {name: p.detach().clone() for name, p in wide.named_parameters()}
        optimizer.zero_grad()
        objective.loss(wide, x, y).backward()
        optimizer.step()
        width = objective.sampled[-1]
        small = build_model(model_name, width).double()
        with torch.no_grad():
            for name, param in small.named_parameters():
                param.copy_(extract(reference[name], specs[name], width))
        torch.nn.functional.cross_entropy(small(x if x.dtype == torch.long else x.double()), y).backward()
        for name, param in small.named_parameters():
            insert_(reference[name], (param - lr * param.grad).detach(), specs[name])
        for name, param in wide.named_parameters():  # outside the drawn width: not touched by this step
            outside = torch.ones_like(param, dtype=torch.bool)
            region(outside, specs[name].sliced_shape(width), specs[name].gate_blocks).fill_(False)
            assert torch.equal(param.detach()[outside], before[name][outside])
    assert min(objective.sampled) < 0.75 and len(set(objective.sampled)) >= 2  # nested widths were drawn
    for name, param in wide.named_parameters():
        torch.testing.assert_close(param.detach().double(), reference[name], rtol=1e-4, atol=1e-5)


def test_without_kd_the_draws_are_the_kd_runs_and_the_default_is_kd(config4):
    with_kd = FjORD(small_config(algorithm="fjord"), P_MAX_4, SAMPLES_4)
    without = FjORD(small_config(algorithm="fjord", algorithm_options={"fjord_kd": False}), P_MAX_4, SAMPLES_4)
    assert with_kd.options.fjord_kd is True and with_kd.objective(0, 3, 1.0).kd is True
    draws = []
    for algorithm in (with_kd, without):
        objective = algorithm.objective(2, 3, 1.0)
        objective.setup(None, {}, 1.0, torch.Generator())
        draws.append([objective.sample_width() for _ in range(40)])
    assert draws[0] == draws[1] and without.objective(2, 3, 1.0).kd is False


@pytest.mark.parametrize("kd", [True, False])
def test_the_device_clock_charges_the_widths_each_step_runs(kd):
    """With KD a step runs p^max and the drawn nested width q < p^max; without, q alone; q from the objective's draws."""
    from hasfl_ray.clock.cost import TRAIN_FACTOR
    from hasfl_ray.engine import Engine, RunConfig

    tier = lambda w: dict(width=w, speed=1e8, down=1e6, up=1e6, latency=0.1)  # noqa: E731
    engine = Engine(RunConfig(backend="local", clients=6, clients_per_round=3, rounds=1, seed=3, checkpoint_every=0,
                              algorithm="fjord", algorithm_options={"fjord_kd": kd},
                              devices={"tiers": [tier(w) for w in (0.25, 0.5, 0.75, 1.0)]}))
    engine.prepare()
    client = int(np.argmax(engine.p_max))
    width = float(engine.p_max[client])
    base = engine.clock.base_cost(client, width)
    cost = engine.algorithm.client_cost(0, client, width, base)
    objective = engine.algorithm.objective(0, client, width)
    objective.setup(None, {}, width, torch.Generator())
    drawn = [objective.sample_width() for _ in range(base.steps)]
    macs = engine.clock.costs.macs
    expected = [TRAIN_FACTOR * ((macs(width) if kd else 0) + macs(q) if q < width else macs(width)) * int(b)
                for q, b in zip(drawn, base.batches)]
    assert min(drawn) < width and cost.step_macs.tolist() == expected
    assert (cost.bytes_down, cost.bytes_up) == (base.bytes_down, base.bytes_up)


@pytest.mark.parametrize("value", ["no", 0, None])
def test_a_bad_fjord_kd_is_one_sentence(value):
    from hasfl_ray.engine import RunConfig
    from hasfl_ray.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({"backend": "local", "algorithm": "fjord", "algorithm_options": {"fjord_kd": value}})
    assert f"fjord_kd is {value!r}; expected true or false" in str(info.value) and "\n" not in str(info.value)
