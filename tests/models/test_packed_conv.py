"""Evaluation convolutions with their weights reordered once (issue 46 item 1, hasfl_ray/models/packed_conv.py) give
the same bits as torch's own convolution, which reorders the weight on every forward; every other forward (autograd,
another layout, another dtype, a shape torch sends to another kernel) is torch's own. And evaluation without the NaN
fill of new tensors (hasfl_ray/models/unfilled.py) computes the same values."""

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from hasfl_ray.engine import eval_layout
from hasfl_ray.models import build_model, packed_conv
from hasfl_ray.models.packed_conv import PackedConv2d, conv_reference, pack_convolutions
from hasfl_ray.models.resnet import PreResNet18, PreResNet1112, ResNet18, StaticBatchNorm2d, sbn_statistics
from hasfl_ray.models import unfilled

pytestmark = pytest.mark.skipif(not packed_conv.available(),
                                reason="this torch has no oneDNN prepacked convolution (a build without oneDNN)")

#: (in, out, kernel, stride, padding, groups, bias, input (batch, height, width)): the built-in networks'
#: convolutions (PreResNet stem, 3x3 and strided 1x1 shortcuts; the CNN's biased convs on 1 channel, EMNIST's
#: 28x28; a depth exit's depthwise conv) at the batches evaluation runs (the sBN pass's stacks, a short last
#: stack, the test pass's forwards of 50, a batch of 500, a batch of one).
SHAPES = [(3, 64, 3, 1, 1, 1, False, (30, 32, 32)), (64, 64, 3, 1, 1, 1, False, (20, 32, 32)),
          (64, 128, 1, 2, 0, 1, False, (50, 32, 32)), (128, 256, 3, 2, 1, 1, False, (30, 16, 16)),
          (512, 512, 3, 1, 1, 1, False, (30, 4, 4)), (256, 512, 3, 2, 1, 1, False, (7, 8, 8)),
          (1, 32, 3, 1, 1, 1, True, (500, 28, 28)), (32, 64, 3, 1, 1, 1, True, (33, 14, 14)),
          (16, 16, 3, 1, 1, 16, False, (12, 8, 8)), (8, 8, 3, 1, 1, 1, True, (1, 5, 5)),
          (8, 16, 1, 1, 0, 1, False, (1, 2, 2)), (16, 32, 3, 2, 1, 1, False, (30, 2, 2)),
          (32, 32, 3, 1, 1, 1, False, (30, 1, 1))]


def packed(cin, cout, kernel, stride, padding, groups, bias, seed=0):
    torch.manual_seed(seed)
    conv = nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=bias)
    return pack_convolutions(conv.to(memory_format=torch.channels_last))


def image(shape, channels, seed=1):
    batch, height, width = shape
    x = torch.randn(batch, channels, height, width, generator=torch.Generator().manual_seed(seed))
    return x.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}k{s[2]}s{s[3]}g{s[5]}b{int(s[6])}n{s[7][0]}")
def test_the_packed_convolution_is_torchs_bit_for_bit(shape):
    *spec, size = shape
    conv = packed(*spec)
    assert type(conv) is PackedConv2d
    x = image(size, spec[0])
    with torch.no_grad():
        expected = conv_reference(conv, x)
        out, again = conv(x), conv(x)  # the second forward reuses the reordered weight
    assert torch.equal(out, expected) and torch.equal(again, expected)
    assert out.stride() == expected.stride()  # later kernels choose their path by the strides (1x1: ambiguous)
    for batch in {max(1, size[0] // 2), size[0] + 7, 1}:  # the weight reordered at the first batch size, reused
        other = image((batch,) + size[1:], spec[0], seed=batch)
        with torch.no_grad():
            out, expected = conv(other), conv_reference(conv, other)
        assert torch.equal(out, expected) and out.stride() == expected.stride()


def test_a_new_weight_or_input_shape_is_reordered_afresh():
    conv = packed(16, 32, 3, 1, 1, 1, True)
    x, y = image((30, 8, 8), 16), image((20, 8, 8), 16, seed=2)
    with torch.no_grad():
        first = conv(x)
        conv.weight.copy_(torch.randn_like(conv.weight))  # a new global model, copied in as the server does
        conv.bias.add_(1.0)
        after = conv(x)
        other = conv(y)
        assert torch.equal(after, conv_reference(conv, x)) and not torch.equal(after, first)
        held = packed_conv._PACKED[conv].packed
        assert torch.equal(other, conv_reference(conv, y))
        assert packed_conv._PACKED[conv].packed is held  # one reordering a weight, whatever the batch
        conv.weight.data = torch.randn_like(conv.weight).contiguous(memory_format=torch.channels_last)
        assert torch.equal(conv(y), conv_reference(conv, y))


def test_training_and_other_layouts_take_torchs_own_forward():
    conv = packed(4, 8, 3, 1, 1, 1, True)
    x = image((6, 8, 8), 4).requires_grad_()
    out = conv(x)  # autograd: torch's path, gradients as ever
    out.sum().backward()
    assert x.grad is not None and conv.weight.grad is not None
    assert conv not in packed_conv._PACKED
    with torch.no_grad():
        plain = torch.randn(6, 4, 8, 8)  # NCHW: not the evaluation layout
        assert torch.equal(conv(plain), conv_reference(conv, plain))
        double = image((6, 8, 8), 4).double()
        conv.double()
        assert torch.equal(conv(double), conv_reference(conv, double))
    assert conv not in packed_conv._PACKED


def test_the_module_keeps_its_state_and_copies_and_pickles():
    model = eval_layout._evaluation_layout(PreResNet18(norm="sbn", in_channels=3, num_classes=4, image_size=8,
                                                       stages=(4, 8, 8, 8)))
    assert all(type(m) is PackedConv2d for m in model.modules() if isinstance(m, nn.Conv2d))
    model.eval()
    x = image((5, 8, 8), 3)
    with torch.no_grad():
        model.conv1(x)  # a reordered weight held
    keys = set(PreResNet18(norm="sbn", in_channels=3, num_classes=4, image_size=8, stages=(4, 8, 8, 8))
               .state_dict())
    assert set(model.state_dict()) == keys
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.conv1 not in packed_conv._PACKED
        with torch.no_grad():
            assert torch.equal(clone.conv1(x), model.conv1(x))
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)


def test_disabled_leaves_plain_convolutions():
    packed_conv.ENABLED = False
    try:
        model = pack_convolutions(nn.Sequential(nn.Conv2d(3, 4, 3)))
    finally:
        packed_conv.ENABLED = True
    assert type(model[0]) is nn.Conv2d


def network_outputs(model, batches, test, stack):
    sbn_statistics(model, batches, stack=stack)
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(test[i:i + 50]) for i in range(0, test.shape[0], 50)])
    norms = [m for m in model.modules() if isinstance(m, StaticBatchNorm2d)]
    return [m.running_mean.clone() for m in norms] + [m.running_var.clone() for m in norms], logits


@pytest.mark.parametrize("arch", [PreResNet1112, ResNet18])
def test_the_sbn_pass_and_test_pass_of_a_network_are_the_same_bits(arch):
    torch.manual_seed(0)
    base = arch(norm="sbn", in_channels=3, num_classes=10, image_size=16, stages=(16, 32, 64, 128))
    generator = torch.Generator().manual_seed(4)
    sizes = [10] * 7 + [4]  # the source's batches, a short last one
    batches = [(torch.randn(n, 3, 16, 16, generator=generator) * (1 + b), torch.zeros(n, dtype=torch.int64))
               for b, n in enumerate(sizes)]
    test = torch.randn(120, 3, 16, 16, generator=generator)
    results = {}
    for enabled in (False, True):
        packed_conv.ENABLED = enabled
        try:
            model = eval_layout._evaluation_layout(copy.deepcopy(base))
        finally:
            packed_conv.ENABLED = True
        assert any(type(m) is PackedConv2d for m in model.modules()) == enabled
        results[enabled] = network_outputs(model, batches, test, stack=30)
    (stats0, logits0), (stats1, logits1) = results[False], results[True]
    assert all(torch.equal(a, b) for a, b in zip(stats0, stats1))
    assert torch.equal(logits0, logits1)


def test_the_emnist_cnn_evaluates_to_the_same_bits():
    torch.manual_seed(0)
    base = build_model("emnist")
    x = torch.randn(300, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    out = {}
    for enabled in (False, True):
        packed_conv.ENABLED = enabled
        try:
            model = eval_layout._evaluation_layout(copy.deepcopy(base)).eval()
        finally:
            packed_conv.ENABLED = True
        with torch.no_grad():
            out[enabled] = model(x)
    assert torch.equal(out[False], out[True])


def test_unfilled_memory_turns_the_fill_off_inside_only():
    settings = pytest.importorskip("torch.utils.deterministic")
    saved = torch.are_deterministic_algorithms_enabled()
    before = settings.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        settings.fill_uninitialized_memory = True
        assert torch.isnan(torch.empty(64)).all()  # what the fill costs: every new tensor written once more
        with unfilled.unfilled_memory():
            assert settings.fill_uninitialized_memory is False
            with unfilled.unfilled_memory():
                assert settings.fill_uninitialized_memory is False
            assert settings.fill_uninitialized_memory is False
        assert settings.fill_uninitialized_memory is True
        unfilled.EVALUATION_UNFILLED = False
        try:
            with unfilled.unfilled_memory():
                assert settings.fill_uninitialized_memory is True
        finally:
            unfilled.EVALUATION_UNFILLED = True
        with pytest.raises(RuntimeError):
            with unfilled.unfilled_memory():
                raise RuntimeError("inside")
        assert settings.fill_uninitialized_memory is True
    finally:
        settings.fill_uninitialized_memory = before
        torch.use_deterministic_algorithms(saved)


def test_evaluation_without_the_fill_gives_the_same_bits():
    from hasfl_ray.data.base import TensorFederatedDataset
    from hasfl_ray.training.evaluate import evaluate

    generator = torch.Generator().manual_seed(6)
    labels = torch.randint(0, 4, (90,), generator=generator)
    x = torch.randn(90, 3, 8, 8, generator=generator) + labels.view(-1, 1, 1, 1)
    data = TensorFederatedDataset("toy", "toy", 4, x[:60], labels[:60], x[60:], labels[60:],
                                  [torch.arange(0, 30), torch.arange(30, 60)])
    data.view_keeps_train = True
    torch.manual_seed(0)
    base = PreResNet18(norm="sbn", in_channels=3, num_classes=4, image_size=8, stages=(4, 8, 8, 8))
    batches = [(x[i:i + 10], labels[i:i + 10]) for i in range(0, 60, 10)]
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    results = []
    try:
        for skip_fill in (False, True):
            unfilled.EVALUATION_UNFILLED = skip_fill
            model = eval_layout._evaluation_layout(copy.deepcopy(base))
            sbn_statistics(model, batches)
            stats = [b.clone() for n, b in model.named_buffers() if "running" in n]
            results.append((stats, evaluate(model, data, batch_size=13)))
    finally:
        unfilled.EVALUATION_UNFILLED = True
        torch.use_deterministic_algorithms(saved)
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))
    assert results[0][1] == results[1][1]
