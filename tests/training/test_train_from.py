"""Trainer.train_from: a client that receives only its sub-model (a Flower client, hasfl_ray.flower) trains exactly
as one cut from the global model: the same update, loss and steps, bit for bit, for every kind of sub-model (a
leading slice, a rolling window, channel index sets, a depth sub-model), and the names its sub-model travels in
(hasfl_ray.flower.sub_model_names) are the starting point's."""

import pytest
import torch

from hasfl_ray.aggregation import IndexedUpdate
from hasfl_ray.data import load_dataset
from hasfl_ray.engine.participants import initial_parameters
from hasfl_ray.flower import sub_model_names
from hasfl_ray.models import build_model, register_model
from hasfl_ray.models.choice import with_exits
from hasfl_ray.models.index_slicing import random_channel_sets
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer
from hasfl_ray.training.task import ExitsObjective

SETTINGS = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=10.0, local_epochs=1, batch_size=16)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=6, alpha=0.3, seed=0)


def tasks():
    specs = build_model("digits").param_specs()
    channels = random_channel_sets(specs, 0.5, torch.Generator().manual_seed(4))
    return {"slice": ClientTask(1, 2, 0.5, 0.05, 7), "full": ClientTask(2, 0, 1.0, 0.05, 7),
            "window": ClientTask(3, 1, 0.5, 0.05, 7, offset=5),
            "channels": ClientTask(0, 1, 0.5, 0.05, 7, channels=tuple(map(tuple, channels)))}


def same(a, b):
    assert list(a.update) == list(b.update)
    for name in a.update:
        x, y = a.update[name], b.update[name]
        if isinstance(x, IndexedUpdate):
            assert isinstance(y, IndexedUpdate) and torch.equal(x.values, y.values), name
        else:
            assert torch.equal(x, y), name
    assert (a.loss, a.steps, a.num_samples, a.offset) == (b.loss, b.steps, b.num_samples, b.offset)
    assert a.steps > 0


@pytest.mark.parametrize("kind", sorted(tasks()))
def test_training_from_the_sub_model_is_training_from_the_global_model(digits, kind):
    task = tasks()[kind]
    trainer = Trainer(digits, "digits", SETTINGS)
    params = initial_parameters("digits", 0)
    start = trainer.workspace.starting_point(task, params)
    assert list(start) == sub_model_names(trainer.workspace, task)
    received = {name: tensor.clone() for name, tensor in start.items()}  # what arrives: the sub-model alone
    same(trainer.train_from(task, received), Trainer(digits, "digits", SETTINGS).train(task, params))
    first = next(iter(received))  # and it is the sub-model received that it trains from
    moved = trainer.train_from(task, {**received, first: received[first] + 0.5})
    assert moved.loss != Trainer(digits, "digits", SETTINGS).train(task, params).loss


def test_a_depth_sub_model_trains_the_same_from_its_own_parameters():
    dataset = with_exits(load_dataset("digits", num_clients=6, alpha=0.3, seed=0))
    register_model(dataset.model, dataset.model_config)
    params = initial_parameters(dataset.model, 0)
    task = ClientTask(0, 0, 0.5, 0.05, 0, ExitsObjective(), depth=1)
    trainer = Trainer(dataset, dataset.model, SETTINGS)
    start = trainer.workspace.starting_point(task, params)
    names = sub_model_names(trainer.workspace, task)
    assert list(start) == names and len(names) < len(params)  # only its stages and exits travel
    same(trainer.train_from(task, dict(start)), Trainer(dataset, dataset.model, SETTINGS).train(task, params))
