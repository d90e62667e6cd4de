"""The sources' schedules and local work (issue 35 item 9): a step learning-rate schedule (--lr-milestones,
--lr-gamma) as PyTorch's MultiStepLR gives it when stepped once after each round (HeteroFL's and FedRolex's
``scheduler.step()`` per global epoch), and a fixed number of local iterations (--local-steps; FIARSE's 100) in
place of epochs, on every training path and in the device clock."""

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.clock.cost import local_batches
from hasfl_ray.config import RunConfig
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.schedule import round_lr
from hasfl_ray.training.batched import train_batched
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer


@pytest.mark.parametrize("milestones,gamma,decay", [([3, 5], 0.1, 1.0), ([1], 0.25, 1.0), ([2, 4, 6], 0.5, 0.99)])
def test_the_step_schedule_is_multisteplr_stepped_after_each_round(milestones, gamma, decay):
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    steps = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=gamma)
    for t in range(9):
        expected = optimizer.param_groups[0]["lr"] * decay ** t  # the source's lr, then our per-round decay
        assert round_lr(0.1, decay, t, milestones, gamma) == pytest.approx(expected, rel=1e-12)
        optimizer.step()
        steps.step()
    assert round_lr(0.1, 0.995, 7) == 0.1 * 0.995 ** 7  # without milestones: the decay alone, the same bits


def trainer(steps=None):
    torch.manual_seed(0)
    sizes = [70, 33, 5]
    n = sum(sizes)
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8)
    y = torch.randint(0, 10, (n,))
    data = TensorFederatedDataset("digits", "digits", 10, x, y, x[:8], y[:8], list(torch.arange(n).split(sizes)),
                                  mean=[0.5], std=[0.25])
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=2, batch_size=16,
                                 local_steps=steps)
    params = {k: v.detach().clone() for k, v in build_model("digits").named_parameters()}
    return Trainer(data, "digits", settings), params


@pytest.mark.parametrize("steps", [1, 4, 11])
def test_a_client_trains_exactly_local_steps_iterations_one_at_a_time_and_batched(steps):
    model, params = trainer(steps)
    tasks = [ClientTask(c, 0, 0.5, 0.05, 7) for c in range(3)]
    alone = [model.train(task, params) for task in tasks]
    # 70, 33 and 5 samples give 5, 2 (a last batch of 1 is skipped) and 1 batches an epoch: as many epochs as the
    # asked steps take
    assert [r.steps for r in alone] == [steps] * 3
    together = train_batched(model, tasks, params)
    for a, b in zip(alone, together):
        assert a.steps == b.steps == steps
        for name in a.update:
            torch.testing.assert_close(b.update[name], a.update[name], rtol=1e-4, atol=1e-6)
    epochs, _ = trainer(None)
    assert [r.steps for r in (epochs.train(task, params) for task in tasks)] == [10, 4, 2]  # 2 epochs, unchanged


def test_the_clock_costs_local_steps():
    assert local_batches(70, 16, 2).tolist() == [16, 16, 16, 16, 6] * 2
    assert local_batches(70, 16, 2, steps=7).tolist() == [16, 16, 16, 16, 6, 16, 16]
    assert local_batches(33, 16, 1, steps=5).tolist() == [16, 16, 16, 16, 16]


def test_a_run_with_a_step_schedule_and_local_steps_differs_and_the_flags_read(tmp_path):
    base = ["simulate", "--backend", "local", "--rounds", "3", "--clients", "4", "--clients-per-round", "2",
            "--quiet", "--lr-decay", "1"]
    plain = CliRunner().invoke(main, base + ["--out", str(tmp_path / "a")])
    stepped = CliRunner().invoke(main, base + ["--lr-milestones", "1,2", "--lr-gamma", "0.5", "--local-steps", "3",
                                               "--weight-decay", "0", "--out", str(tmp_path / "b")])
    assert plain.exit_code == 0 and stepped.exit_code == 0, stepped.output
    import yaml
    config = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    assert (config["lr_milestones"], config["lr_gamma"], config["local_steps"], config["weight_decay"]) == \
        ([1, 2], 0.5, 3, 0.0)
    import json
    a = json.loads((tmp_path / "a" / "summary.json").read_text())["params_sha256"]
    b = json.loads((tmp_path / "b" / "summary.json").read_text())["params_sha256"]
    assert a != b


@pytest.mark.parametrize("values,phrase", [
    ({"lr_milestones": [5, 3]}, "lr_milestones is [5, 3]; expected increasing positive round numbers"),
    ({"lr_milestones": [0]}, "lr_milestones is [0]"),
    ({"lr_gamma": 0}, "lr_gamma is 0; expected a number in (0, 1]"),
    ({"local_steps": 0}, "local_steps is 0; expected a positive number of local iterations"),
])
def test_bad_values_are_one_sentence(values, phrase):
    with pytest.raises(ConfigError, match=phrase.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        RunConfig(backend="local", **values)
    flag = {"lr_milestones": "--lr-milestones", "lr_gamma": "--lr-gamma", "local_steps": "--local-steps"}
    key, value = next(iter(values.items()))
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", flag[key], text])
    assert result.exit_code == 2 and "Traceback" not in result.output
