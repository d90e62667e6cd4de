"""The server's full-width evaluation (channels-last since issue 46 item 1) against the plain computation: a model in
the default memory layout, one forward per test batch, top-1 by argmax, mean cross-entropy, on random models. The
accuracy is the same sample for sample; the loss within float rounding (another convolution kernel); with the
benchmark's switch back to the default layout (``eval_layout.FULL_WIDTH_LAYOUT``) both are the same bits."""

import copy

import pytest
import torch
from torch.nn import functional as F

from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.engine import eval_layout
from hasfl_ray.engine.server import Server
from hasfl_ray.engine.statistics import StatisticsPlan, pass_batches
from hasfl_ray.models import build_model, register_model
from hasfl_ray.models.resnet import sbn_statistics

STAGES = dict(in_channels=3, num_classes=5, image_size=16, stages=(4, 8, 8, 8))


def toy_images(seed):
    """60 training and 40 test RGB images of 5 classes, 16x16, three clients."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 5, (100,), generator=generator)
    x = (torch.rand(100, 3, 16, 16, generator=generator) * 150 + labels.view(-1, 1, 1, 1) * 20).to(torch.uint8)
    clients = [torch.arange(0, 20), torch.arange(20, 45), torch.arange(45, 60)]
    data = TensorFederatedDataset("toy", "toy", 5, x[:60], labels[:60], x[60:], labels[60:], clients,
                                  mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    data.view_keeps_train = True
    return data


def plain(model, dataset, batch_size):
    """Right answers (bool per test sample) and mean cross-entropy, the simplest way: default layout, argmax."""
    model.eval()
    right, loss, total = [], 0.0, 0
    with torch.no_grad():
        for x, y in dataset.test_batches(batch_size):
            logits = model(x)
            right.append(logits.argmax(dim=1) == y)
            loss += float(F.cross_entropy(logits, y, reduction="sum"))
            total += len(y)
    return torch.cat(right), loss / total


def server_right(server):
    labels, beats = server.test_beats([1.0])
    return torch.as_tensor((beats[1.0] == 0).all(axis=1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_digits_cnn_scores_the_same_samples_right(seed):
    from hasfl_ray.data import load_plugin_dataset
    from hasfl_ray.engine import RunConfig
    from hasfl_ray.registry import lookup

    dataset = load_plugin_dataset(lookup("dataset", "digits"), RunConfig(dataset="digits", seed=seed))
    torch.manual_seed(seed)
    model = build_model("digits")
    server = Server("digits", dict(model.state_dict()), dataset, eval_batch_size=100)
    assert any(p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
               for p in server.model.parameters())  # the fast layout is in use
    accuracy, loss = server.evaluate()
    right, plain_loss = plain(model, dataset.test_view(), 100)
    assert torch.equal(server_right(server), right)
    assert accuracy == float(right.double().mean())
    assert loss == pytest.approx(plain_loss, rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_an_sbn_resnet_scores_the_same_samples_right_and_the_old_layout_is_bit_identical(seed, monkeypatch):
    name = "preresnet18-test-eval-fast-path"
    register_model(name, dict(kind="preresnet18", norm="sbn", **STAGES))
    data = toy_images(seed)
    torch.manual_seed(seed)
    model = build_model(name)
    plan = StatisticsPlan("shuffled", 10, seed, "training_set")
    reference = copy.deepcopy(model)
    with torch.no_grad():
        sbn_statistics(reference, pass_batches(data.test_view(), plan))  # the same pass, in the default layout
    right, plain_loss = plain(reference, data.test_view(), 8)
    fast = Server(name, dict(model.state_dict()), data, eval_batch_size=8, statistics=plan)
    accuracy, loss = fast.evaluate()
    assert torch.equal(server_right(fast), right) and accuracy == float(right.double().mean())
    assert loss == pytest.approx(plain_loss, rel=1e-4)
    monkeypatch.setattr(eval_layout, "FULL_WIDTH_LAYOUT", "default")  # the benchmark's "before"
    before = Server(name, dict(model.state_dict()), data, eval_batch_size=8, statistics=plan)
    assert before.evaluate() == (float(right.double().mean()), plain_loss)


def test_a_bad_layout_switch_is_one_sentence(monkeypatch):
    monkeypatch.setattr(eval_layout, "FULL_WIDTH_LAYOUT", "nhwc")
    with pytest.raises(ValueError, match=r"^FULL_WIDTH_LAYOUT is 'nhwc'; expected channels_last or default$"):
        Server("digits", dict(build_model("digits").state_dict()), toy_images(0), eval_batch_size=8)


def test_the_local_accuracy_pass_reuses_the_test_pass_and_forgets_it_when_the_model_moves():
    data = toy_images(3)
    torch.manual_seed(3)
    name = "preresnet18-test-eval-fast-path"
    register_model(name, dict(kind="preresnet18", norm="sbn", **STAGES))
    plan = StatisticsPlan("shuffled", 10, 3, "training_set")
    params = [dict(build_model(name).state_dict()) for _ in range(2)]
    shared = Server(name, params[0], data, eval_batch_size=8, statistics=plan)
    shared.evaluate()
    shared.evaluate_widths([0.5])
    forwards = []
    hooks = [m.register_forward_hook(lambda *_: forwards.append(1)) for m in (shared.model, shared.width_model(0.5))]
    labels, packed = shared.test_beats([0.5, 1.0])
    assert not forwards  # both from the passes evaluate() and evaluate_widths() made
    fresh_labels, fresh = Server(name, params[0], data, eval_batch_size=8, statistics=plan).test_beats([0.5, 1.0])
    assert (labels == fresh_labels).all() and all((packed[w] == fresh[w]).all() for w in (0.5, 1.0))
    shared.set_params(params[1])  # another global model: nothing kept
    labels, packed = shared.test_beats([1.0])
    assert forwards
    for hook in hooks:
        hook.remove()
    _, moved = Server(name, params[1], data, eval_batch_size=8, statistics=plan).test_beats([1.0])
    assert (packed[1.0] == moved[1.0]).all() and not (moved[1.0] == fresh[1.0]).all()
