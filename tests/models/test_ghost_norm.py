"""The sBN statistics pass in stacked forwards (issue 46 item 1, hasfl_ray/models/ghost_norm.py): the source's batches
(HeteroFL's ``stats``, src/train_classifier_fed.py at cc40f3e: a shuffled loader of batch 10 into a ``track=True``
model, BatchNorm2d with momentum None, the cumulative average of the batches' means and unbiased variances) stacked
several to a forward, each norm running each batch as its own. Checked against one forward a batch and against
HeteroFL's rule written out (nn.BatchNorm2d(momentum=None) in train mode), in float64, a short last batch included."""

import importlib

import pytest
import torch
from torch import nn

from hasfl_ray.engine.eval_layout import _evaluation_layout
from hasfl_ray.engine.server import Server
from hasfl_ray.models import ghost_norm, register_model
from hasfl_ray.models.ghost_norm import stacked_batches
from hasfl_ray.models.resnet import PreResNet18, StaticBatchNorm2d, sbn_statistics

STAGES = dict(in_channels=3, num_classes=4, image_size=8, stages=(4, 8, 8, 8))
SIZES = (10, 10, 10, 10, 10, 7)  # the source's loader: batches of 10, the last one short (its own batch)


def batches(dtype=torch.float64, sizes=SIZES):
    generator = torch.Generator().manual_seed(3)
    out = []
    for number, size in enumerate(sizes):  # batches of other statistics, so merging two would show
        x = torch.randn(size, 3, 8, 8, generator=generator, dtype=torch.float64) * (1 + number) + number
        out.append((x.to(dtype), torch.zeros(size, dtype=torch.int64)))
    return out


def norms(model):
    return [m for m in model.modules() if isinstance(m, StaticBatchNorm2d)]


def statistics_of(model):
    return [(m.running_mean.clone(), m.running_var.clone(), int(m.num_batches_tracked)) for m in norms(model)]


def network(dtype=torch.float64):
    torch.manual_seed(0)
    return PreResNet18(norm="sbn", **STAGES).to(dtype)


def heterofl_reference(model, data):
    """HeteroFL's stats written out: the same weights with nn.BatchNorm2d(momentum=None, track_running_stats=True),
    the whole network in train mode (the Scaler divides by 1 at width 1), one forward a batch."""
    reference = network(next(model.parameters()).dtype)
    reference.load_state_dict(model.state_dict(), strict=False)
    for module in list(reference.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, StaticBatchNorm2d):
                tracked = nn.BatchNorm2d(child.num_features, momentum=None, track_running_stats=True)
                tracked.load_state_dict(child.state_dict(), strict=False)
                setattr(module, name, tracked.to(next(model.parameters()).dtype))
    reference.train()
    with torch.no_grad():
        for x, _ in data:
            reference(x)
    return [m for m in reference.modules() if isinstance(m, nn.BatchNorm2d)]


@pytest.mark.parametrize("stack", [20, 25, 30, 1000])
def test_stacked_pass_is_one_forward_a_batch_and_heterofls_rule_in_float64(stack):
    data = batches()
    one, stacked = network(), network()
    assert sbn_statistics(one, data, stack=1) and sbn_statistics(stacked, data, stack=stack)
    for (m1, v1, n1), (m2, v2, n2), theirs in zip(statistics_of(one), statistics_of(stacked),
                                                  heterofl_reference(one, data)):
        assert n1 == n2 == len(SIZES) == int(theirs.num_batches_tracked)  # each batch counted once, the short one too
        torch.testing.assert_close(m2, m1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(v2, v1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(m2, theirs.running_mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(v2, theirs.running_var, rtol=1e-12, atol=1e-12)


def test_each_batch_is_its_own_group_not_the_stack():
    """Normalising the stack as one batch would give other statistics (the batches differ in mean and spread)."""
    data = batches()
    stacked, merged = network(), network()
    sbn_statistics(stacked, data, stack=1000)
    sbn_statistics(merged, [(torch.cat([x for x, _ in data]), None)], stack=1)
    first = lambda model: norms(model)[0]  # noqa: E731
    assert int(first(stacked).num_batches_tracked) == len(SIZES) and int(first(merged).num_batches_tracked) == 1
    assert not torch.allclose(first(stacked).running_var, first(merged).running_var, rtol=1e-3)


def counting_norm(channels, momentum, dtype):
    torch.manual_seed(channels)
    layer = nn.BatchNorm2d(channels, momentum=momentum).to(dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1, 1)
    return layer.train()


@pytest.mark.parametrize("dtype,channels_last,momentum,side", [(torch.float32, True, None, 6),
                                                               (torch.float64, False, None, 6),
                                                               (torch.float32, False, 0.1, 6),
                                                               (torch.float32, True, 0.3, 6),
                                                               (torch.float32, True, None, 1),
                                                               (torch.float32, False, None, 1)])
def test_the_batches_written_in_place_are_the_concatenations_bits(dtype, channels_last, momentum, side):
    """The CPU form without autograd (each batch's output written into its rows) against the concatenation of
    ``nn.BatchNorm2d.forward`` over each batch (the form before it): the same output bits and strides (at 1x1 a
    tensor is both contiguous and channels-last, and later kernels choose their path by its strides), running
    statistics and batch count."""
    sizes = [10, 10, 7]
    generator = torch.Generator().manual_seed(9)
    x = (torch.randn(27, 16, side, side, generator=generator, dtype=torch.float64) * 2 + 1).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    into, reference = counting_norm(16, momentum, dtype), counting_norm(16, momentum, dtype)
    with torch.no_grad():
        out = ghost_norm.ghost_forward(into, x, sizes)
        expected = torch.cat([nn.BatchNorm2d.forward(reference, part) for part in torch.split(x, sizes)])
        expected = expected.contiguous(memory_format=ghost_norm._format(x))
    assert torch.equal(out, expected) and out.stride() == expected.stride()
    assert out.is_contiguous(memory_format=torch.channels_last) == (channels_last or side == 1)
    assert torch.equal(into.running_mean, reference.running_mean) and torch.equal(into.running_var,
                                                                                  reference.running_var)
    assert int(into.num_batches_tracked) == int(reference.num_batches_tracked) == 3
    with_grad = counting_norm(16, momentum, dtype)  # autograd: the concatenation (out= takes no gradient)
    assert torch.equal(ghost_norm.ghost_forward(with_grad, x, sizes).detach(), expected)


def test_stacks_hold_whole_batches_in_order_the_short_last_one_its_own():
    data = batches(sizes=(10, 10, 10, 10, 10, 10, 10, 3))
    stacks = list(stacked_batches(data, 25))
    assert [sizes for _, sizes in stacks] == [[10, 10, 10], [10, 10, 10], [10, 3]]
    torch.testing.assert_close(torch.cat([x for x, _ in stacks]), torch.cat([x for x, _ in data]), rtol=0, atol=0)
    assert [sizes for _, sizes in stacked_batches(data, 1)] == [[10]] * 7 + [[3]]
    assert list(stacked_batches([], 25)) == []


def test_channels_last_float32_pass_equals_one_forward_a_batch_and_keeps_the_layout():
    data = batches(torch.float32)
    one, stacked = _evaluation_layout(network(torch.float32)), _evaluation_layout(network(torch.float32))
    sbn_statistics(one, data, stack=1)
    sbn_statistics(stacked, data, stack=30)
    for (m1, v1, _), (m2, v2, _) in zip(statistics_of(one), statistics_of(stacked)):
        torch.testing.assert_close(m2, m1, rtol=1e-5, atol=1e-6)  # float rounding at most (another batch size)
        torch.testing.assert_close(v2, v1, rtol=1e-5, atol=1e-6)
    layer = norms(stacked)[0]
    layer.train()
    layer.ghost_sizes = [10, 10, 7]
    x = torch.randn(27, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    try:
        out = layer(x)
    finally:
        layer.ghost_sizes = None
        layer.eval()
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_the_servers_accuracy_is_the_same_stacked_or_one_forward_a_batch(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (57,), generator=generator)
    x = torch.randn(57, 3, 8, 8, generator=generator) + labels.view(-1, 1, 1, 1)
    from hasfl_ray.data.base import TensorFederatedDataset

    data = TensorFederatedDataset("toy", "toy", 4, x, labels, x[:20], labels[:20],
                                  [torch.nonzero(labels == c).flatten() for c in range(4)])
    data.view_keeps_train = True
    torch.manual_seed(0)
    params = dict(PreResNet18(norm="sbn", **STAGES).state_dict())
    register_model("preresnet18-test-ghost-norm", dict(kind="preresnet18", norm="sbn", **STAGES))
    results = {}
    for stack in (1, 30):
        monkeypatch.setattr(ghost_norm, "STACK_SAMPLES", stack)
        server = Server("preresnet18-test-ghost-norm", params, data, eval_batch_size=5, statistics=("shuffled", 10, 3))
        results[stack] = server.evaluate()
    assert results[30][0] == results[1][0]  # the accuracy
    assert results[30][1] == pytest.approx(results[1][1], rel=1e-5)  # the loss, to float rounding


def test_a_per_sample_evaluation_is_cut_into_smaller_forwards_with_the_same_results(monkeypatch):
    """With sBN's running statistics the outputs are per sample (hasfl_ray/training/evaluate.py::per_sample), so a
    CPU evaluation batch runs in forwards of PER_SAMPLE_FORWARD; without them (before the pass, FedRolex's
    test_batch mode, the CNN's batch-statistics BatchNorm) the batch is one forward, its statistics the protocol's."""
    from hasfl_ray.data.base import TensorFederatedDataset
    from hasfl_ray.models import build_model
    evaluating = importlib.import_module("hasfl_ray.training.evaluate")  # the module, not the re-exported function

    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (40,), generator=generator)
    x = torch.randn(40, 3, 8, 8, generator=generator) + labels.view(-1, 1, 1, 1)
    data = TensorFederatedDataset("toy", "toy", 4, x, labels, x[:23], labels[:23], [torch.arange(40)])
    model = network(torch.float32)
    assert not evaluating.per_sample(model)  # no running statistics yet: each batch's own
    assert not evaluating.per_sample(build_model("emnist"))
    sbn_statistics(model, [(x[i:i + 10], None) for i in range(0, 40, 10)])
    assert evaluating.per_sample(model)
    sizes = []
    model.register_forward_pre_hook(lambda module, args: sizes.append(args[0].shape[0]))
    monkeypatch.setattr(evaluating, "PER_SAMPLE_FORWARD", 0)
    whole = evaluating.evaluate(model, data, batch_size=20)
    assert sizes == [20, 3]
    sizes.clear()
    monkeypatch.setattr(evaluating, "PER_SAMPLE_FORWARD", 7)
    cut = evaluating.evaluate(model, data, batch_size=20)
    assert sizes == [7, 7, 6, 3]
    assert cut[0] == whole[0] and cut[1] == pytest.approx(whole[1], rel=1e-6)
