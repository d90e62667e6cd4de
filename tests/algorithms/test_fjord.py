"""FjORD: the widths each client samples, their distribution, the nested forward pass and avg_p."""

import numpy as np
import pytest
import torch

from algorithm_runs import LEARNING_RUN, P_MAX_4, SAMPLES_4, recorded_run, small_config
from hasfl_ray.algorithms.fjord import FjORD, OrderedDropoutObjective, nested_parameters
from hasfl_ray.data import load_dataset
from hasfl_ray.models import build_model, extract
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
