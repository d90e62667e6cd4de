"""FIARSE's rules (issue 44 item 2) checked against the source's expressions, re-implemented here from the source, not
from hasfl_ray's functions.

The source: github.com/HarliWu/FIARSE, commit 281519c6fb9ac4846fb0098fb6db4ff41849271b.

``fiarse/model/resnet_masked.py::BetaResNet.generate_mask`` (server.py calls it with ``topk=True, bern=True``)::

    scores = torch.abs(self.to_vector('param', layerwise=False))
    self.mask = torch.zeros_like(scores)
    numel = len(self.mask)
    topk_result = torch.topk(scores, k=int(numel*model_size))
    self.mask[topk_result.indices] = 1
    self.threshold = topk_result.values[-1]
    self.set_threshold(self.threshold, bern=bern)

``to_vector`` concatenates, in module order, each MaskedConv2d's / MaskedLinear's ``weight.view(-1)`` then
``bias.view(-1)``; the norm layers have ``size = 0`` and no ``to_vector``. ``fiarse_layerwise/``'s
``layer_wise_generate_mask`` does the same per stage (``[self.conv1, self.layer1, ..., self.linear]``).

``fiarse/model/model_utils.py``::

    class Bern(torch.autograd.Function):
        def forward(ctx, scores, threshold):
            ctx.save_for_backward(scores, scalar*threshold)
            return (scores>=threshold)
        def backward(ctx, grad_output):
            scores, threshold = ctx.saved_tensors
            grad = 2 * threshold / torch.pow(scores+threshold, 2)
            grad = torch.nan_to_num(grad, nan=0., posinf=0., neginf=0.)
            mask = (scores>=threshold)
            return grad_output*grad*mask, None
    # MaskedConv2d.forward:  weight_mask = Bern.apply(torch.abs(self.weight), self.threshold)
    #                        effective_weight = self.weight * weight_mask

``fiarse/server.py::Server.simulation_exp``::

    for name, grad in gradient.items():       # gradient[name] = cache_param - cur_param (worker.py)
        tot_grad[name] += grad
        tot_mask[name] += (grad != 0)
    avg_grad = tot_grad[name] / tot_mask[name]
    avg_grad = torch.nan_to_num(avg_grad, nan=0.0, posinf=0.0, neginf=0.0)
    model_params[name] -= (self.args.lr_global * avg_grad)
"""

import pytest
import torch
from torch import nn

from hasfl_ray.algorithms.league import fiarse
from hasfl_ray.errors import ConfigError


class _SmallNet(nn.Module):
    """Two stages of convs with norms between, then a classifier: the shapes FIARSE's ResNet scores."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, bias=False)
        self.norm1 = nn.BatchNorm2d(8)
        self.layer1 = nn.Sequential(nn.Conv2d(8, 8, 3, bias=True), nn.BatchNorm2d(8))
        self.linear = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.norm1(self.conv1(x)))
        x = self.layer1(x).mean(dim=(2, 3))
        return self.linear(x)


STAGE = {"conv1.weight": "conv1", "layer1.0.weight": "layer1", "layer1.0.bias": "layer1",
         "linear.weight": "linear", "linear.bias": "linear"}


def _net(seed=0):
    torch.manual_seed(seed)
    return _SmallNet()


def _source_to_vector(net):
    """``to_vector('param')``: each masked conv/linear's weight then bias, module order; norms skipped."""
    vectors = []
    for module in (net.conv1, net.layer1[0], net.linear):
        vectors.append(module.weight.view(-1))
        if module.bias is not None:
            vectors.append(module.bias.view(-1))
    return vectors


def test_scored_names_are_the_conv_and_linear_weights_and_biases_not_the_norms():
    assert fiarse.scored_names(_net()) == list(STAGE)


@pytest.mark.parametrize("size", [1.0, 0.25, 0.0625, 0.015625])
def test_global_threshold_is_generate_masks_topk_over_every_scored_parameter(size):
    net = _net()
    params = dict(net.named_parameters())
    scores = torch.abs(torch.concat(_source_to_vector(net)))
    expected = torch.topk(scores, k=int(len(scores) * size)).values[-1]
    limits = fiarse.thresholds(params, fiarse.scored_names(net), size)
    assert all(torch.equal(t, expected) for t in limits.values())
    got = fiarse.masks(params, limits)
    assert torch.equal(torch.cat([got[n].reshape(-1) for n in STAGE]), scores >= expected)
    assert fiarse.kept_fraction(params, limits) == pytest.approx(float(torch.sum(scores >= expected) / len(scores)))


def test_stage_thresholds_are_layer_wise_generate_masks_one_per_stage():
    net = _net(1)
    params = dict(net.named_parameters())
    limits = fiarse.thresholds(params, fiarse.scored_names(net), 0.25, scope="stage", stage_of=STAGE)
    stages = {"conv1": [net.conv1.weight.view(-1)],  # each stage's to_vector: its convs' and linears' tensors
              "layer1": [net.layer1[0].weight.view(-1), net.layer1[0].bias.view(-1)],  # its BatchNorm has none
              "linear": [net.linear.weight.view(-1), net.linear.bias.view(-1)]}
    for stage, vector in stages.items():
        scores = torch.abs(torch.concat(vector))
        expected = torch.topk(scores, k=int(scores.numel() * 0.25)).values[-1]
        assert all(torch.equal(limits[n], expected) for n in STAGE if STAGE[n] == stage)
    assert not torch.equal(limits["conv1.weight"], limits["linear.weight"])


def test_ties_at_the_threshold_are_kept_so_the_size_can_exceed_the_target():
    scores = torch.tensor([3.0, 2.0, 2.0, 2.0, 1.0])
    limit = fiarse.threshold(scores, 0.4)  # k = int(5 * 0.4) = 2 -> T = 2.0
    assert float(limit) == 2.0 and int((scores >= limit).sum()) == 4


class _SourceBern(torch.autograd.Function):
    """``Bern`` as the source writes it."""

    @staticmethod
    def forward(ctx, scores, threshold):
        ctx.save_for_backward(scores, threshold)
        return scores >= threshold

    @staticmethod
    def backward(ctx, grad_output):
        scores, threshold = ctx.saved_tensors
        grad = torch.nan_to_num(2 * threshold / torch.pow(scores + threshold, 2), nan=0., posinf=0., neginf=0.)
        return grad_output * grad * (scores >= threshold), None


def test_the_source_trains_with_the_masked_gradient_because_berns_bool_output_has_no_backward():
    torch.manual_seed(3)
    w = torch.randn(6, 4, requires_grad=True)
    g = torch.randn(6, 4)
    limit = torch.tensor(0.7)
    (w * _SourceBern.apply(torch.abs(w), limit) * g).sum().backward()
    source_grad = w.grad.clone()
    assert torch.equal(source_grad, g * (w.detach().abs() >= limit))  # Bern.backward did not run
    w.grad = None
    (fiarse.effective_weight(w, limit, "source") * g).sum().backward()
    assert torch.equal(w.grad, source_grad)


def test_the_surrogate_gradient_is_berns_backward_written_out():
    torch.manual_seed(4)
    w = torch.randn(10, requires_grad=True)
    limit = torch.tensor(0.5)
    (fiarse.effective_weight(w, limit, "surrogate")).sum().backward()
    a = w.detach().abs()
    m = (a >= limit).float()
    expected = m + w.detach() * torch.sign(w.detach()) * 2 * limit / (a + limit) ** 2 * m
    torch.testing.assert_close(w.grad, expected)
    assert torch.equal(fiarse.effective_weight(w, limit, "surrogate"), w * m)


def test_a_weight_that_shrinks_below_the_threshold_leaves_the_mask_in_the_next_forward():
    w = torch.tensor([0.9, 0.55], requires_grad=True)
    limit = torch.tensor(0.5)
    assert torch.equal(fiarse.effective_weight(w, limit) != 0, torch.tensor([True, True]))
    with torch.no_grad():
        w[1] = 0.45  # a local step moved it below T
    assert torch.equal(fiarse.effective_weight(w, limit) != 0, torch.tensor([True, False]))


def test_aggregation_is_the_servers_mean_over_clients_that_changed_each_coordinate():
    torch.manual_seed(5)
    glob = {"a": torch.randn(4, 3), "norm.running_mean": torch.randn(3)}
    deltas = []
    for i in range(3):
        d = {k: torch.randn_like(v) for k, v in glob.items()}
        d["a"] = d["a"] * (torch.rand(4, 3) > 0.4)  # each client changed a subset
        deltas.append(d)
    deltas[0]["a"][0, 0] = deltas[1]["a"][0, 0] = deltas[2]["a"][0, 0] = 0.0  # nobody changed it
    lr_global = 0.5
    expected = {k: v.clone() for k, v in glob.items()}
    tot_grad = {k: torch.zeros_like(v) for k, v in glob.items()}
    tot_mask = {k: torch.zeros_like(v) for k, v in glob.items()}
    for gradient in deltas:
        for name, grad in gradient.items():
            tot_grad[name] += grad
            tot_mask[name] += (grad != 0)
    for name in expected:
        avg_grad = torch.nan_to_num(tot_grad[name] / tot_mask[name], nan=0.0, posinf=0.0, neginf=0.0)
        if "running_mean" in name:
            expected[name] = expected[name] - avg_grad
        else:
            expected[name] -= lr_global * avg_grad
    got = fiarse.aggregate(glob, deltas, lr_global)
    for name in glob:
        torch.testing.assert_close(got[name], expected[name])
    assert got["a"][0, 0] == glob["a"][0, 0]


@pytest.mark.parametrize("field, value, words", [
    ("fiarse_scope", "layer", "fiarse_scope is 'layer'; expected global"),
    ("fiarse_mask_gradient", "ste", "fiarse_mask_gradient is 'ste'; expected source"),
    ("fiarse_lr_global", 0.0, "fiarse_lr_global is 0.0; expected a number in (0, 1000]"),
    ("fiarse_lr_global", float("nan"), "fiarse_lr_global is nan; expected"),
])
def test_options_out_of_range_are_refused_in_one_sentence(field, value, words):
    with pytest.raises(ConfigError) as caught:
        fiarse.FIARSEOptions(**{field: value})
    assert str(caught.value).startswith(words) and "\n" not in str(caught.value)


def test_a_size_that_keeps_no_parameter_is_refused_in_one_sentence():
    with pytest.raises(ConfigError, match=r"keeps int\(10 x 0.05\) = 0 of 10 scored parameters"):
        fiarse.threshold(torch.rand(10), 0.05)
    with pytest.raises(ConfigError, match="model size is 1.5; expected a fraction"):
        fiarse.threshold(torch.rand(10), 1.5)


def test_on_hasfl_rays_cnn_the_norms_are_left_whole_and_a_quarter_is_kept():
    from hasfl_ray.models import build_model

    torch.manual_seed(0)
    model = build_model("cifar10", 0.25)
    params = dict(model.named_parameters())
    names = fiarse.scored_names(model)
    norms = {n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    assert names and not any(n.rsplit(".", 1)[0] in norms for n in names)
    assert set(params) - set(names) == {f"{m}.{p}" for m in norms for p in ("weight", "bias")}
    limits = fiarse.thresholds(params, names, 0.25)
    assert fiarse.kept_fraction(params, limits) == pytest.approx(0.25, abs=1e-4)
