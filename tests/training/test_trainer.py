"""The trainer trains the units a backend planned, as they are: a backend groups a round's tasks once
(group_tasks), Trainer.train_unit never groups again; the testing faults apply once per client whatever the unit;
hasfl_ray.training.local still exports the training API."""

import math

import pytest
import torch

import hasfl_ray.engine.backend as local_backend
import hasfl_ray.training.batched as batched
import hasfl_ray.training.trainer as trainer_module
from hasfl_ray.algorithms.fjord import OrderedDropoutObjective
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.models import build_model
from hasfl_ray.training.batched import train_batched
from hasfl_ray.training.task import ClientTask, OptimizerSettings
from hasfl_ray.training.trainer import Trainer

SIZES = [40, 33, 17, 5]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    n = sum(SIZES)
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8)
    y = torch.randint(0, 10, (n,))
    dataset = TensorFederatedDataset("digits", "digits", 10, x, y, x[:8], y[:8], list(torch.arange(n).split(SIZES)),
                                     mean=[0.5], std=[0.25])
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=1, batch_size=16)
    params = {k: v.detach().clone() for k, v in build_model("digits").named_parameters()}
    return dataset, settings, params


def identical(a, b):
    return (a.client, a.loss, a.steps, a.extras.keys()) == (b.client, b.loss, b.steps, b.extras.keys()) and \
        all(torch.equal(a.update[n], b.update[n]) for n in a.update)


@pytest.fixture
def no_regrouping(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a planned unit was grouped again")

    monkeypatch.setattr(trainer_module, "group_tasks", refuse)
    monkeypatch.setattr(batched, "group_tasks", refuse)


def test_train_unit_trains_a_planned_unit_as_it_is(setup, no_regrouping):
    dataset, settings, params = setup
    trainer = Trainer(dataset, "digits", settings)
    group = [ClientTask(c, 1, 0.5, 0.05, 7) for c in range(4)]
    for got, want in zip(trainer.train_unit(group, params), train_batched(trainer.workspace, group, params)):
        assert identical(got, want)
    alone = ClientTask(2, 1, 0.5, 0.05, 7, OrderedDropoutObjective([0.25, 0.5], 1.0, seed=5))
    [got] = trainer.train_unit([alone], params)
    assert identical(got, trainer.train(alone, params))


def test_the_local_backend_plans_each_round_once_and_the_trainer_never_regroups(monkeypatch, no_regrouping):
    planned = []
    plan = local_backend.group_tasks

    def counting(tasks, batching, **kwargs):
        planned.append(len(tasks))
        return plan(tasks, batching, **kwargs)

    monkeypatch.setattr(local_backend, "group_tasks", counting)
    summary = Engine(RunConfig(rounds=2, clients=6, clients_per_round=3, warmup=1, t_adapt=1, backend="local",
                               device="cpu", client_batching="on", algorithm="heterofl")).run()
    assert planned == [3, 3] and summary["params_sha256"]


def test_train_group_plans_a_plain_list_and_keeps_task_order(setup):
    dataset, settings, params = setup
    trainer = Trainer(dataset, "digits", settings)
    tasks = [ClientTask(0, 1, 0.5, 0.05, 7), ClientTask(1, 1, 0.25, 0.05, 7), ClientTask(2, 1, 0.5, 0.05, 7)]
    results = trainer.train_group(tasks, params)
    assert [r.client for r in results] == [0, 1, 2]
    assert identical(results[1], trainer.train(tasks[1], params))  # a width alone trains one at a time
    for got, want in zip([results[0], results[2]], train_batched(trainer, [tasks[0], tasks[2]], params)):
        assert identical(got, want)


@pytest.mark.parametrize("size", [1, 3])
def test_faults_apply_once_per_client_alone_or_batched(setup, size):
    dataset, settings, params = setup
    trainer = Trainer(dataset, "digits", settings)
    tasks = [ClientTask(c, 1, 0.5, 0.05, 7, fault="nan" if c == 0 else None) for c in range(size)]
    clean = [ClientTask(c, 1, 0.5, 0.05, 7) for c in range(size)]
    for c, (got, want) in enumerate(zip(trainer.train_unit(tasks, params), trainer.train_unit(clean, params))):
        first = next(iter(got.update))
        assert got.is_finite() == (c != 0)
        if c == 0:
            assert math.isnan(float(got.update[first].view(-1)[0]))
            assert torch.equal(got.update[first].view(-1)[1:], want.update[first].view(-1)[1:])
        else:
            assert identical(got, want)
    failing = tasks[:-1] + [ClientTask(size - 1, 3, 0.5, 0.05, 7, fault="trainer")]
    fresh = Trainer(dataset, "digits", settings)
    with pytest.raises(RuntimeError, match=r"injected trainer failure \(--fault-inject trainer-error@3\)"):
        fresh.train_unit(failing, params)
    assert fresh.cached_widths == []  # raised before anything trained


def test_local_still_exports_the_training_api():
    from hasfl_ray.training import local, result, task, trainer

    assert local.ClientTask is task.ClientTask and local.LocalObjective is task.LocalObjective
    assert local.OptimizerSettings is task.OptimizerSettings and local.graphable is task.graphable
    assert local.ClientResult is result.ClientResult and local.Trainer is trainer.Trainer


def test_the_model_cache_is_an_lru_bounded_by_bytes_and_a_rebuilt_network_trains_the_same(setup):
    """Issue 46 item 4: a run of continuous widths (every client a new width) holds at most MODEL_CACHE_WEIGHTS
    full-width networks' weights: the least recently used go until the new network fits, in the order an LRU of
    these sizes gives; a cached width is reused (the same network, nothing rebuilt); and a width whose network was
    dropped and rebuilt trains bit for bit as on a fresh trainer."""
    from collections import OrderedDict

    from hasfl_ray.training.workspace import MODEL_CACHE, MODEL_CACHE_WEIGHTS, weight_bytes

    dataset, settings, params = setup
    trainer = Trainer(dataset, "digits", settings)
    bound = trainer.workspace.cache_bound
    assert bound == MODEL_CACHE_WEIGHTS * weight_bytes(build_model("digits"))
    widths = [round(0.3 + 0.05 * k, 2) for k in range(15)]  # 0.3 ... 1.0: about 6.9 full-width networks' weights
    sizes = {w: weight_bytes(build_model("digits", w)) for w in widths}
    assert sum(sizes.values()) > 2 * bound and len(widths) < MODEL_CACHE  # the bytes bound, not the count, bites
    expected = OrderedDict()
    for k, width in enumerate(widths + widths[:3]):  # the first three come back after they were dropped
        if width in expected:
            expected.move_to_end(width)
        else:
            while expected and sum(expected.values()) + sizes[width] > bound:
                expected.popitem(last=False)
            expected[width] = sizes[width]
        task = ClientTask(k % len(SIZES), k, width, 0.05, 3)
        assert identical(trainer.train(task, params), Trainer(dataset, "digits", settings).train(task, params))
        assert trainer.cached_widths == list(expected)  # least recently used first
        assert trainer.workspace.cached_bytes == sum(expected.values()) <= bound
    assert len(expected) < len(widths)
    held = trainer.workspace.cached_bytes
    oldest, newest = trainer.cached_widths[0], trainer.cached_widths[-1]
    network = trainer.model_at(oldest)  # a hit: the same network, moved to the end, nothing evicted
    assert trainer.model_at(oldest) is network and trainer.cached_widths[-1] == oldest
    assert trainer.workspace.cached_bytes == held and newest in trainer.cached_widths
    trainer.release(keep=[newest])
    assert trainer.cached_widths == [newest] and trainer.workspace.cached_bytes == sizes[newest]


def test_a_cached_network_keeps_no_gradients_between_clients(setup):
    """Issue 46 item 4: the LRU holds weights only (a network's gradients are dropped once its client is trained),
    so what it holds is its networks' weights; the next client trains the same as on a fresh trainer."""
    dataset, settings, params = setup
    trainer = Trainer(dataset, "digits", settings)
    first, second = ClientTask(0, 0, 0.5, 0.05, 3), ClientTask(1, 1, 0.5, 0.05, 3)
    trainer.train(first, params)
    assert all(p.grad is None for p in trainer.model_at(0.5).parameters())
    assert identical(trainer.train(second, params), Trainer(dataset, "digits", settings).train(second, params))
