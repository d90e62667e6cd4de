"""FjORD against its authors' Flower baseline (adap/flower ``baselines/fjord``, commit fdef7afb), each rule restated
here in our own code on FjORD's ResNet-18 (small stages, so the test is quick) and compared with hasfl-ray's.

- ``fjord/models.py::train``: one SGD step a batch (lr, weight decay over the client's whole model, momentum 0).
  With KD: CE(f_{p_max}(x), y).backward(), then CE(f_p(x), softmax(f_{p_max}(x)).detach()).backward() (a soft
  target, temperature 1), p drawn from the tiers <= p_max (p_max included: the second gradient is then zero).
  Without KD: CE(f_p(x), y).backward() alone. f_p is the network on the leading ceil(p * C) channels of every
  hidden layer (``od/layers/conv.py``, ``linear.py``: the classifier's outputs and the image channels not sliced),
  every norm on its own batch's statistics in training, with the affine weights' leading entries.
- ``fjord/strategy.py::fjord_average``: for p over the tiers in descending order, the width-p slice of every layer is
  overwritten by the example-weighted mean over the clients with p_max >= p (skipped when there are none), starting
  from the round's global parameters.
"""

import math

import pytest
import torch
from torch.nn import functional as F

from hasfl_ray.aggregation import aggregate_updates
from hasfl_ray.algorithms.fjord import OrderedDropoutObjective
from hasfl_ray.models import extract
from hasfl_ray.models.resnet import ResNet18

STAGES = (4, 8, 12, 16)
TIERS = [0.2, 0.4, 0.6, 0.8, 1.0]


def resnet(width: float) -> torch.nn.Module:
    return ResNet18(num_classes=10, norm="sbn", scaler=False, width=width, stages=STAGES).double().train()


def source_slice(name: str, shape, p: float):
    """The width-p slice of a parameter as the baseline's OD layers cut it: ceil(p * C) leading entries of every
    channel dim, except the image channels (the stem conv's inputs) and the classifier's outputs (``is_od=False``)."""
    kept = lambda c: int(math.ceil(c * p))  # noqa: E731  (ODConv2d: int(np.ceil(layer.width * p)))
    if name == "conv1.weight":
        return (slice(kept(shape[0])), slice(None))
    if name == "linear.weight":
        return (slice(None), slice(kept(shape[1])))
    if name == "linear.bias":
        return (slice(None),)
    return tuple(slice(kept(c)) for c in shape[:2])


def source_step(params, x, y, p_max, p, kd, lr, wd):
    """One step of ``models.py::train`` on the full-shape parameters ``params`` (float64, updated in place), as the
    baseline's client holds the whole network and runs it at p_max and at p."""
    grads = {name: torch.zeros_like(t) for name, t in params.items()}

    def width_loss(width, target):
        cuts = {name: source_slice(name, t.shape, width) for name, t in params.items()}
        leaves = {name: params[name][cut].clone().requires_grad_() for name, cut in cuts.items()}
        out = torch.func.functional_call(resnet(width), leaves, (x,))
        F.cross_entropy(out, target).backward()
        for name, leaf in leaves.items():
            grads[name][cuts[name]] += leaf.grad
        return out

    if kd:
        full = width_loss(p_max, y)
        width_loss(p, full.detach().softmax(dim=1))
    else:
        width_loss(p, y)
    with torch.no_grad():
        for name in params:
            params[name] -= lr * (grads[name] + wd * params[name])


@pytest.mark.parametrize("kd", [True, False])
@pytest.mark.parametrize("p_max", [0.6, 1.0])
def test_a_local_step_is_the_baselines_train_step(kd, p_max):
    torch.manual_seed(0)
    reference = {name: t.detach().clone() for name, t in resnet(1.0).named_parameters()}
    specs = resnet(1.0).param_specs()
    model = resnet(p_max)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(extract(reference[name], specs[name], p_max))
    widths = [t for t in TIERS if t <= p_max + 1e-12]
    objective = OrderedDropoutObjective(widths, 1.0, seed=5, kd=kd)
    objective.setup(model, {}, p_max, torch.Generator(), model_at=resnet)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0, weight_decay=1e-4)
    for _ in range(6):
        x, y = torch.randn(8, 3, 16, 16, dtype=torch.float64), torch.randint(0, 10, (8,))
        optimizer.zero_grad()
        objective.loss(model, x, y).backward()
        optimizer.step()
        source_step(reference, x, y, p_max, objective.sampled[-1], kd, 0.1, 1e-4)
        for name, param in model.named_parameters():  # the client's p_max slice of the baseline's whole network
            torch.testing.assert_close(param.detach(), extract(reference[name], specs[name], p_max),
                                       rtol=1e-9, atol=1e-11)
    assert len(set(objective.sampled)) >= 2 and min(objective.sampled) < p_max  # nested widths were drawn


def fjord_average(original, weights_by_client, examples, p_maxes):
    """``strategy.py::fjord_average`` restated: descending p, overwrite the width-p slice with the example-weighted
    mean of the full-shape client parameters over the clients with p_max >= p."""
    out = {name: t.clone() for name, t in original.items()}
    for p in sorted(TIERS, reverse=True):
        chosen = [i for i, p_max in enumerate(p_maxes) if p_max >= p]
        if not chosen:
            continue
        total = sum(examples[i] for i in chosen)
        for name, t in out.items():
            cut = source_slice(name, t.shape, p)
            t[cut] = sum(examples[i] * weights_by_client[i][name][cut] for i in chosen) / total
    return out


def test_aggregation_is_the_baselines_fjord_average():
    torch.manual_seed(1)
    specs = resnet(1.0).param_specs()
    original = {name: p.detach().clone() for name, p in resnet(1.0).named_parameters()}
    p_maxes, examples = [0.2, 0.6, 0.6, 0.8, 0.4], [500, 120, 300, 80, 410]  # no client at 1.0 this round
    trained = [{name: t + torch.randn_like(t) for name, t in original.items()} for _ in p_maxes]
    expected = fjord_average(original, trained, examples, p_maxes)
    updates = [{name: extract(trained[i][name] - original[name], specs[name], p_max) for name in specs}
               for i, p_max in enumerate(p_maxes)]
    result = aggregate_updates({n: s.shape for n, s in specs.items()}, updates, [float(n) for n in examples],
                               backend="reference")
    for name in specs:
        torch.testing.assert_close(original[name] + result.delta[name], expected[name], rtol=1e-12, atol=1e-12)
    outside = source_slice("layer4.1.conv2.weight", original["layer4.1.conv2.weight"].shape, 0.8)
    kept = torch.ones_like(original["layer4.1.conv2.weight"], dtype=torch.bool)
    kept[outside] = False
    assert torch.equal(expected["layer4.1.conv2.weight"][kept], original["layer4.1.conv2.weight"][kept])  # untrained


def test_each_evaluated_width_of_the_resnet_has_batchnorm_statistics_of_its_own():
    """The baseline evaluates each p with that p's own BatchNorm statistics; hasfl-ray's sBN gives each evaluated
    width statistics from a pass of the width-p network itself, not the full network's statistics cut to p."""
    from hasfl_ray.data.base import TensorFederatedDataset
    from hasfl_ray.engine.server import Server
    from hasfl_ray.models import register_model

    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (40,), generator=generator)
    x = torch.randn(40, 3, 16, 16, generator=generator)
    clients = [torch.arange(20), torch.arange(20, 40)]
    data = TensorFederatedDataset("toy", "toy", 10, x, labels, x[:10], labels[:10], clients)
    data.view_keeps_train = True
    name = "resnet18-test-fjord-eval-stats"
    register_model(name, dict(kind="resnet18", norm="sbn", scaler=False, in_channels=3, num_classes=10, image_size=16,
                              stages=STAGES))
    torch.manual_seed(2)
    params = {k: v.float() for k, v in resnet(1.0).state_dict().items()}
    server = Server(name, params, data, eval_batch_size=10, statistics=("in_order", 10, 3))
    full, half = server.width_model(1.0).layer2[0].n1, server.width_model(0.5).layer2[0].n1
    assert half.running_mean is not None and full.running_mean is not None
    assert half.running_mean.shape == (math.ceil(0.5 * STAGES[1]),)
    assert not torch.allclose(half.running_mean, full.running_mean[:half.running_mean.numel()])
