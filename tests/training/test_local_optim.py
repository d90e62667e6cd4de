"""Local optimisers beyond SGD (hasfl_ray/training/local_optim.py): a client trained with ``--local-optimizer adam``
against Adam written out in float64 (Kingma and Ba's update with torch's L2 weight decay, after clipping), such
clients trained one at a time even where batching is asked for, ``sgd`` keeping the built-in step's bits, and bad
names or options refused in one sentence (exit 2 at the CLI)."""

import json
import os

import pytest
import torch
from click.testing import CliRunner
from torch.nn import functional as F

from hasfl_ray.cli.main import main
from hasfl_ray.data.digits import load_digits_federated
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.participants import initial_parameters
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.training.task import ClientTask, OptimizerSettings
from hasfl_ray.training.trainer import Trainer
from hasfl_ray.training.workspace import client_batches, client_generator

ADAM = dict(betas=[0.8, 0.95], eps=1e-6)


def reference_adam(dataset, task, start, settings, steps):
    """Adam by hand in float64 on the batches the client draws: g ← clip(∇) + λ w; m ← β1 m + (1 − β1) g;
    v ← β2 v + (1 − β2) g²; w ← w − lr (m / (1 − β1^t)) / (√(v / (1 − β2^t)) + ε)."""
    (b1, b2), eps, lam = ADAM["betas"], ADAM["eps"], settings.weight_decay
    model = build_model("digits").double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(start[name].double())
    m = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    v = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    n_samples = dataset.client_size(task.client)
    batches = client_batches(client_generator(task), n_samples, settings.batch_size, 1, None, steps)
    model.train()
    for t, positions in enumerate(batches, start=1):
        x, y = dataset.client_batch(task.client, positions)
        model.zero_grad()
        F.cross_entropy(model(x.double()), y).backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        norm = torch.sqrt(sum(g.square().sum() for g in grads.values()))
        scale = min(1.0, settings.clip_norm / (float(norm) + 1e-6))
        with torch.no_grad():
            for n, p in model.named_parameters():
                g = grads[n] * scale + lam * p
                m[n] = b1 * m[n] + (1 - b1) * g
                v[n] = b2 * v[n] + (1 - b2) * g * g
                p -= task.lr * (m[n] / (1 - b1 ** t)) / ((v[n] / (1 - b2 ** t)).sqrt() + eps)
    return {n: p.detach() - start[n].double() for n, p in model.named_parameters()}


def test_a_client_trained_with_adam_equals_adam_in_float64():
    dataset = load_digits_federated(6, 0.3, 3)
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-3, clip_norm=1.0, local_epochs=1, batch_size=16,
                                 local_steps=3, optimizer="Adam", optimizer_options=ADAM)
    start = initial_parameters("digits", 3)
    task = ClientTask(0, 2, 1.0, 0.01, 3)
    got = Trainer(dataset, "digits", settings).train(task, start).update
    want = reference_adam(dataset, task, start, settings, 3)
    for name, delta in got.items():
        assert torch.allclose(delta.double(), want[name], rtol=1e-4, atol=2e-5), name  # float32 (steps ~3e-2)
    sgd = Trainer(dataset, "digits", OptimizerSettings(clip_norm=1.0, local_epochs=1, batch_size=16, local_steps=3))
    plain = sgd.train(task, start).update
    assert any(not torch.allclose(got[k], plain[k]) for k in got)


def test_clients_of_another_optimiser_train_one_at_a_time_where_batching_is_asked_for():
    dataset = load_digits_federated(6, 0.3, 3)
    settings = OptimizerSettings(local_epochs=1, batch_size=16, local_steps=2, optimizer="AdamW")
    trainer = Trainer(dataset, "digits", settings)
    start = initial_parameters("digits", 3)
    tasks = [ClientTask(c, 0, 0.5, 0.01, 3) for c in (0, 1, 2)]
    together = trainer.train_group(tasks, start, batching="on")
    alone = [trainer.train(task, start) for task in tasks]
    for a, b in zip(together, alone):
        assert all(torch.equal(a.update[k], b.update[k]) for k in a.update)


SMALL = dict(backend="local", rounds=2, clients=6, clients_per_round=3, local_epochs=1, seed=3, checkpoint_every=0)


def test_sgd_keeps_the_built_in_step_and_its_bits(tmp_path):
    plain = Engine(RunConfig(**SMALL), out_dir=str(tmp_path / "plain")).run()
    named = Engine(RunConfig(**SMALL, local_optimizer="SGD", local_optimizer_options={}),
                   out_dir=str(tmp_path / "named")).run()
    adam = Engine(RunConfig(**SMALL, local_optimizer="adam", local_optimizer_options='{"betas": [0.9, 0.99]}'),
                  out_dir=str(tmp_path / "adam")).run()
    assert plain["params_sha256"] == named["params_sha256"] != adam["params_sha256"]
    stored = (tmp_path / "adam" / "config.yaml").read_text()
    assert "local_optimizer: Adam" in stored  # the class's own spelling, its options as a mapping
    config = RunConfig(**SMALL, local_optimizer="adam", local_optimizer_options={"betas": [0.9, 0.99]})
    assert config.local_optimizer_options == {"betas": [0.9, 0.99]}


@pytest.mark.parametrize("values, words", [
    (dict(local_optimizer="adamm"), "local_optimizer is 'adamm'; expected sgd (the built-in step) or the name of a "
                                    "torch.optim optimiser"),
    (dict(local_optimizer=""), "local_optimizer is ''; expected sgd"),
    (dict(local_optimizer="lbfgs"), "local_optimizer is 'LBFGS'; expected an optimiser whose step needs no closure"),
    (dict(local_optimizer="Adam", local_optimizer_options={"lr": 0.1}), "local_optimizer_options sets 'lr'"),
    (dict(local_optimizer="Adam", local_optimizer_options={"betaz": 0.1}),
     "local_optimizer_options {\"betaz\": 0.1} are not Adam's (Adam.__init__() got an unexpected keyword argument "
     "'betaz')"),
    (dict(local_optimizer="Adam", local_optimizer_options={"betas": [0.9, 2.0]}), "are not Adam's (Invalid beta"),
    (dict(local_optimizer="Adam", local_optimizer_options="{betas"), "local_optimizer_options is '{betas'; expected "
                                                                     "a JSON object"),
    (dict(local_optimizer="Adam", local_optimizer_options=[1, 2]), "local_optimizer_options is [1, 2]; expected a "
                                                                   "mapping"),
])
def test_bad_names_and_options_are_one_sentence(values, words):
    with pytest.raises(ConfigError) as error:
        RunConfig(**SMALL, **values)
    assert words in str(error.value), str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("flags, words", [
    (["--local-optimizer", "nadamw"], "local_optimizer is 'nadamw'"),
    (["--local-optimizer", "rmsprop", "--local-optimizer-options", '{"alpha": -1}'], "are not RMSprop's"),
    (["--local-optimizer-options", "[1]"], "local_optimizer_options is [1]; expected a mapping"),
])
def test_bad_values_exit_2_at_the_cli(tmp_path, flags, words):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--quiet", "--out", str(tmp_path / "run"),
                                       *flags])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output, result.output
    assert not os.path.exists(tmp_path / "run")
    assert json  # (the module's JSON options are parsed by the config, not here)
