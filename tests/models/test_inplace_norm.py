"""An evaluation model's BatchNorm right after a convolution normalises the convolution's output in place (issue 46
item 1, hasfl_ray/models/inplace_norm.py): the same bits as ``nn.BatchNorm2d``'s own forward, in every mode it
takes over; every other forward (autograd, a norm updating running statistics, a norm whose input is seen
elsewhere) is torch's own."""

import copy

import pytest
import torch
from torch import nn

from hasfl_ray.engine import eval_layout
from hasfl_ray.models import build_model, inplace_norm
from hasfl_ray.models.inplace_norm import InPlaceBatchNorm2d, normalise_in_place


def norm(channels, track, dtype=torch.float32):
    torch.manual_seed(channels)
    layer = nn.BatchNorm2d(channels, track_running_stats=track).to(dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-1, 1)
        if track:
            layer.running_mean.uniform_(-1, 1)
            layer.running_var.uniform_(0.5, 2)
    return layer


def batch(shape, dtype=torch.float32, channels_last=True, seed=0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3 + 1
    x = x.to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@pytest.mark.parametrize("track,training", [(False, False), (False, True), (True, False)],
                         ids=["batch-statistics-eval", "batch-statistics-train", "running-statistics-eval"])
@pytest.mark.parametrize("dtype,channels_last,shape", [(torch.float32, True, (500, 64, 28, 28)),
                                                       (torch.float32, False, (33, 16, 7, 7)),
                                                       (torch.float64, True, (12, 8, 4, 4)),
                                                       (torch.float32, True, (2, 256, 1, 1))])
def test_in_place_is_batchnorms_own_bits(track, training, dtype, channels_last, shape):
    reference = norm(shape[1], track, dtype).train(training)
    layer = copy.deepcopy(reference)
    layer.__class__ = InPlaceBatchNorm2d
    x = batch(shape, dtype, channels_last)
    with torch.no_grad():
        expected = reference(x.clone())
        out = layer(x)
    assert out.data_ptr() == x.data_ptr()  # written over its input
    assert torch.equal(out, expected)
    if track:
        assert torch.equal(layer.running_mean, reference.running_mean)
        assert torch.equal(layer.running_var, reference.running_var)


def test_autograd_and_updating_statistics_take_torchs_forward():
    layer = norm(8, track=True)
    layer.__class__ = InPlaceBatchNorm2d
    x = batch((6, 8, 5, 5))
    with torch.no_grad():
        out = layer.train()(x)  # training mode with running statistics: it counts the batch, as torch does
    assert out.data_ptr() != x.data_ptr() and int(layer.num_batches_tracked) == 1
    y = batch((6, 8, 5, 5)).requires_grad_()
    out = layer.eval()(y)
    out.sum().backward()
    assert out.data_ptr() != y.data_ptr() and y.grad is not None
    with torch.no_grad(), pytest.raises(ValueError, match="more than 1 value per channel"):
        lone = norm(8, track=False)
        lone.__class__ = InPlaceBatchNorm2d
        lone(batch((1, 8, 1, 1)))


def test_only_a_norm_right_after_a_convolution_in_a_sequential_is_swapped():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4),
                          nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4, track_running_stats=False)))
    normalise_in_place(model)
    assert [type(m).__name__ for m in model.modules() if isinstance(m, nn.BatchNorm2d)] == \
        ["InPlaceBatchNorm2d", "BatchNorm2d", "InPlaceBatchNorm2d"]
    inplace_norm.ENABLED = False
    try:
        plain = normalise_in_place(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    finally:
        inplace_norm.ENABLED = True
    assert type(plain[1]) is nn.BatchNorm2d


@pytest.mark.parametrize("name", ["emnist", "digits"])
def test_the_cnns_evaluation_is_the_same_bits(name):
    torch.manual_seed(0)
    base = build_model(name)
    channels, size = (1, 28) if name == "emnist" else (1, 8)
    x = torch.randn(300, channels, size, size, generator=torch.Generator().manual_seed(1))
    outputs = {}
    for enabled in (False, True):
        inplace_norm.ENABLED = enabled
        try:
            model = eval_layout._evaluation_layout(copy.deepcopy(base)).eval()
        finally:
            inplace_norm.ENABLED = True
        assert any(isinstance(m, InPlaceBatchNorm2d) for m in model.modules()) == enabled
        with torch.no_grad():
            outputs[enabled] = model(x)
    assert torch.equal(outputs[False], outputs[True])
    trained = eval_layout._evaluation_layout(copy.deepcopy(base)).train()
    trained(x[:20]).sum().backward()  # training through the swapped norms: torch's forward and gradients
    assert all(p.grad is not None for p in trained.parameters())
