"""sBN's evaluation statistics as the sources take them (issue 35 item 4): HeteroFL's ``stats``
(src/train_classifier_fed.py at cc40f3e: a ``track=True`` copy of the global model in train mode, the training set
through a shuffled loader of batch 10, BatchNorm with momentum None: the cumulative average) over a seeded permutation
of all clients' samples; in order (the earlier pass) kept as an option; FedRolex's evaluation without a pass (each
test batch normalised with its own statistics). Checked against those rules written out here."""

import numpy as np
import pytest
import torch
from torch import nn

from hasfl_ray.config import RunConfig
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.engine.server import Server
from hasfl_ray.errors import ConfigError
from hasfl_ray.models.resnet import SBN_STREAM, PreResNet18, StaticBatchNorm2d, sbn_statistics, training_batches

STAGES = dict(in_channels=3, num_classes=4, image_size=8, stages=(4, 8, 8, 8))


def dataset():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (60,), generator=generator)
    x = torch.randn(60, 3, 8, 8, generator=generator) + labels.view(-1, 1, 1, 1)  # class-dependent statistics
    clients = [torch.nonzero(labels == c).flatten() for c in range(4)]  # one class a client: order matters
    return TensorFederatedDataset("toy", "toy", 4, x, labels, x[:20], labels[:20], clients)


def test_the_shuffled_pass_is_heterofls_stats_over_a_seeded_permutation():
    data, seed = dataset(), 7
    # the permutation, written out: (client, position) pairs of all clients, shuffled by the run seed's sBN stream
    pairs = [(c, p) for c in range(data.num_clients) for p in range(data.client_size(c))]
    order = np.random.default_rng([seed, SBN_STREAM]).permutation(len(pairs))
    expected = []
    for start in range(0, len(order), 10):
        chunk = [pairs[i] for i in order[start:start + 10]]
        rows = [data.client_indices[c][p] for c in sorted({c for c, _ in chunk}) for cc, p in chunk if cc == c]
        expected.append(data.train_y[torch.stack(rows)])
    got = list(training_batches(data, 10, seed))
    assert [y.tolist() for _, y in got] == [y.tolist() for y in expected]
    assert any(len(set(y.tolist())) > 1 for _, y in got)  # batches mix clients (in order, each is one class)
    # the statistics: HeteroFL's track=True BatchNorm (momentum None) in train mode over the same batches
    torch.manual_seed(0)
    model = PreResNet18(norm="sbn", width=1.0, **STAGES)
    reference = PreResNet18(norm="sbn", width=1.0, **STAGES)
    reference.load_state_dict(model.state_dict())
    for name, module in list(reference.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, StaticBatchNorm2d):
                tracked = nn.BatchNorm2d(child.num_features, momentum=None, track_running_stats=True)
                tracked.load_state_dict(child.state_dict(), strict=False)
                setattr(module, child_name, tracked)
    assert sbn_statistics(model, training_batches(data, 10, seed))
    reference.train()
    with torch.no_grad():
        for x, _ in training_batches(data, 10, seed):
            reference(x)
    ours = [m for m in model.modules() if isinstance(m, StaticBatchNorm2d)]
    theirs = [m for m in reference.modules() if isinstance(m, nn.BatchNorm2d)]
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.running_mean, b.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.running_var, b.running_var, rtol=1e-5, atol=1e-6)


def test_in_order_batches_of_one_client_give_other_statistics():
    data = dataset()
    torch.manual_seed(0)
    shuffled, in_order = PreResNet18(norm="sbn", **STAGES), PreResNet18(norm="sbn", **STAGES)
    in_order.load_state_dict(shuffled.state_dict())
    sbn_statistics(shuffled, training_batches(data, 10, 3))
    sbn_statistics(in_order, training_batches(data, 10))
    first = lambda m: next(x for x in m.modules() if isinstance(x, StaticBatchNorm2d))  # noqa: E731
    # one class a batch in order: each batch's variance misses the spread between classes
    assert float(first(in_order).running_var.mean()) < float(first(shuffled).running_var.mean())


def test_the_server_follows_the_plan_and_test_batch_mode_uses_each_batchs_statistics():
    data = dataset()
    data.view_keeps_train = True
    torch.manual_seed(0)
    params = {k: v for k, v in PreResNet18(norm="sbn", **STAGES).state_dict().items()}
    from hasfl_ray.models import register_model
    name = "preresnet18-test-sbn-pass"
    register_model(name, dict(kind="preresnet18", norm="sbn", **STAGES))
    runs = {mode: Server(name, params, data, eval_batch_size=5, statistics=(mode, 10, 3)).evaluate()
            for mode in ("shuffled", "in_order", "test_batch")}
    assert runs["shuffled"] != runs["in_order"]
    server = Server(name, params, data, eval_batch_size=5, statistics=("test_batch", 10, 3))
    model = server.width_model(1.0)
    assert all(getattr(m, "running_mean", None) is None for m in model.modules() if isinstance(m, StaticBatchNorm2d))
    model.eval()
    with torch.no_grad():  # no running statistics: a 5-sample test batch is normalised with its own
        x = data.test_view()._inputs(data.test_x[:5]) if hasattr(data, "_inputs") else data.test_x[:5]
        alone = model(x)
        together = model(torch.cat([x, x * 3]))[:5]
    assert not torch.allclose(alone, together)


@pytest.mark.parametrize("values,phrase", [({"sbn_statistics": "random"}, "sbn_statistics is 'random'"),
                                           ({"sbn_batch_size": 1}, "sbn_batch_size is 1")])
def test_bad_values_are_one_sentence(values, phrase):
    with pytest.raises(ConfigError, match=phrase):
        RunConfig(backend="local", **values)
