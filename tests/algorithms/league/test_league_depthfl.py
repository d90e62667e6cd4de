"""DepthFL's rules (issue 44 item 2) checked against the source's expressions, re-implemented here from the source.

The source: github.com/adap/flower, commit fdef7afb1dca3030553be302366cfd285ed6632c, ``baselines/depthfl`` (last
changed in 7e1d22642fa084138fc293a3e1b7257881a61383). ``depthfl/models.py``::

    class KLLoss(nn.Module):                      # self.temperature = 1
        def forward(self, pred, label):
            predict = F.log_softmax(pred / self.temperature, dim=1)
            target_data = F.softmax(label / self.temperature, dim=1)
            target_data = target_data + 10 ** (-7)
            with torch.no_grad():
                target = target_data.detach().clone()
            loss = (self.temperature * self.temperature
                    * ((target * (target.log() - predict)).sum(1).sum() / target.size()[0]))

    # _train_one_epoch
    for i, branch_output in enumerate(output_lst):
        if not config["extended"] and i != len(output_lst) - 1:
            continue
        loss += criterion(branch_output, labels)
        if config["kd"] and len(output_lst) > 1:
            for j, output in enumerate(output_lst):
                if j == i:
                    continue
                loss += (consistency_weight * criterion_kl(branch_output, output.detach())
                         / (len(output_lst) - 1))

``depthfl/client.py``: ``consistency_weight_constant = 300; current = np.clip(curr_round, 0.0, 300);
phase = 1.0 - current / 300; consistency_weight = float(np.exp(-5.0 * phase * phase))`` with
``curr_round = int(config["curr_round"]) - 1``. ``depthfl/main.py``: ``model.n_blocks = i // (cfg.num_clients // 4)
+ 1``. ``depthfl/strategy.py::aggregate``::

    for parameters, _ in results:
        for i, layer in enumerate(parameters):
            weights_sum[i] += layer; param_count[i] += 1
    for i, weight in enumerate(weights_sum):
        if param_count[i] > 0:
            weight = weight / param_count[i]
            h_list[i] = h_list[i] - cfg.fit_config.alpha * param_count[i] * (weight - origin[i]) / cfg.num_clients
            if is_weight[i] and cfg.fit_config.feddyn:
                weights_sum[i] = weight - h_list[i] / cfg.fit_config.alpha
            else:
                weights_sum[i] = weight
        else:
            weights_sum[i] = origin[i]
"""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from hasfl_ray.algorithms.league import depthfl
from hasfl_ray.errors import ConfigError


def _source_kl(pred, label, temperature=1):
    predict = F.log_softmax(pred / temperature, dim=1)
    target_data = F.softmax(label / temperature, dim=1)
    target_data = target_data + 10 ** (-7)
    with torch.no_grad():
        target = target_data.detach().clone()
    return temperature * temperature * ((target * (target.log() - predict)).sum(1).sum() / target.size()[0])


def _source_loss(output_lst, labels, consistency_weight, kd=True, extended=True):
    loss = torch.zeros(1)
    for i, branch_output in enumerate(output_lst):
        if not extended and i != len(output_lst) - 1:
            continue
        loss += F.cross_entropy(branch_output, labels)
        if kd and len(output_lst) > 1:
            for j, output in enumerate(output_lst):
                if j == i:
                    continue
                loss += consistency_weight * _source_kl(branch_output, output.detach()) / (len(output_lst) - 1)
    return loss


@pytest.mark.parametrize("kd, extended, exits", [(True, True, 4), (True, False, 4), (False, True, 3),
                                                 (True, True, 1)])
def test_the_local_loss_and_its_gradients_are_the_sources(kd, extended, exits):
    torch.manual_seed(exits)
    logits = [torch.randn(6, 10, requires_grad=True) for _ in range(exits)]
    labels = torch.randint(0, 10, (6,))
    weight = depthfl.consistency_weight(120)
    expected = _source_loss(logits, labels, weight, kd, extended)
    expected.backward()
    want = [x.grad.clone() if x.grad is not None else torch.zeros_like(x) for x in logits]  # InclusiveFL: none
    for x in logits:
        x.grad = None
    got = depthfl.mutual_loss(logits, labels, weight, kd, extended)
    got.backward()
    torch.testing.assert_close(got.reshape(1), expected)
    for x, g in zip(logits, want):
        torch.testing.assert_close(x.grad if x.grad is not None else torch.zeros_like(x), g)


def test_kl_is_klloss_at_a_temperature_too():
    torch.manual_seed(1)
    pred, teacher = torch.randn(5, 7), torch.randn(5, 7)
    for temperature in (1, 3):
        torch.testing.assert_close(depthfl.kl_loss(pred, teacher, temperature), _source_kl(pred, teacher, temperature))


@pytest.mark.parametrize("curr_round", [1, 2, 151, 300, 301, 302, 1000])
def test_consistency_weight_is_the_clients_ramp(curr_round):
    r = curr_round - 1  # the config's curr_round is 1-based
    current = np.clip(r, 0.0, 300)
    phase = 1.0 - current / 300
    assert depthfl.consistency_weight(r) == pytest.approx(float(np.exp(-5.0 * phase * phase)), rel=1e-15)


@pytest.mark.parametrize("num_clients", [100, 8, 10])
def test_depth_of_each_client_is_mains(num_clients):
    got = [depthfl.depth_of(i, num_clients) for i in range(num_clients)]
    assert got == [min(i // (num_clients // 4) + 1, 4) for i in range(num_clients)]
    assert got[0] == 1 and got[-1] == 4
    if num_clients == 100:
        assert [got.count(d) for d in (1, 2, 3, 4)] == [25, 25, 25, 25]


def _source_aggregate(results, origin, h_list, is_weight, alpha, num_clients, feddyn=True):
    param_count = [0] * len(origin)
    weights_sum = [np.zeros(v.shape) for v in origin]
    for parameters in results:
        for i, layer in enumerate(parameters):
            weights_sum[i] += layer
            param_count[i] += 1
    for i, weight in enumerate(weights_sum):
        if param_count[i] > 0:
            weight = weight / param_count[i]
            h_list[i] = h_list[i] - alpha * param_count[i] * (weight - origin[i]) / num_clients
            if is_weight[i] and feddyn:
                weights_sum[i] = weight - h_list[i] / alpha
            else:
                weights_sum[i] = weight
        else:
            weights_sum[i] = origin[i]
    return weights_sum, h_list


@pytest.mark.parametrize("feddyn", [True, False])
def test_aggregation_per_depth_is_the_strategys(feddyn):
    rng = np.random.default_rng(2)
    names = ["stage1.weight", "stage1.norm.running_mean", "stage2.weight", "head2.bias", "stage3.weight"]
    shapes = [(4, 3), (4,), (5, 4), (10,), (6, 5)]
    origin = [rng.normal(size=s) for s in shapes]
    h0 = [rng.normal(size=s) * 0.01 for s in shapes]
    depths = [1, 2, 2, 1]  # nobody holds stage3: it keeps its value
    results = [[origin[i] + rng.normal(size=shapes[i]) for i in range(1 if d == 1 else 4)] for d in depths]
    results = [r[:2] if d == 1 else r for r, d in zip(results, depths)]  # depth 1: stage1 tensors only
    expected, expected_h = _source_aggregate(results, origin, [x.copy() for x in h0],
                                             [depthfl.is_weight(n) for n in names], 0.1, 20, feddyn)
    clients = [{names[i]: torch.from_numpy(x) for i, x in enumerate(r)} for r in results]
    got, got_h = depthfl.aggregate({n: torch.from_numpy(o) for n, o in zip(names, origin)}, clients,
                                   {n: torch.from_numpy(x) for n, x in zip(names, h0)}, 0.1, 20, feddyn)
    for i, name in enumerate(names):
        np.testing.assert_allclose(got[name].numpy(), expected[i], rtol=1e-12)
        np.testing.assert_allclose(got_h[name].numpy(), expected_h[i], rtol=1e-12)
    assert torch.equal(got["stage3.weight"], torch.from_numpy(origin[4]))


def test_feddyn_local_terms_are_the_trains():
    torch.manual_seed(3)
    params = {"a": torch.randn(3, 2, requires_grad=True)}
    glob = {"a": params["a"].detach().clone().flatten() + 0.1}
    prev = {"a": torch.randn(6)}
    alpha = 0.1
    curr = params["a"].flatten()
    expected = -torch.dot(curr, prev["a"]) + alpha / 2.0 * torch.sum(torch.square(curr - glob["a"]))
    torch.testing.assert_close(depthfl.feddyn_penalty(params, glob, prev, alpha), expected)
    updated = depthfl.feddyn_update(prev, params, glob, alpha)
    torch.testing.assert_close(updated["a"], prev["a"] - alpha * (params["a"].detach().flatten() - glob["a"]))


def test_ensemble_is_the_mean_of_the_exits():
    outs = [torch.full((2, 3), float(k)) for k in range(4)]
    assert torch.equal(depthfl.ensemble(outs), torch.full((2, 3), 1.5))


def test_learning_rate_decays_per_round():
    assert depthfl.learning_rate(0) == 0.1 and depthfl.learning_rate(10) == pytest.approx(0.1 * 0.998 ** 10)


@pytest.mark.parametrize("field, value, words", [
    ("depthfl_kd", "yes", "depthfl_kd is 'yes'; expected true or false"),
    ("depthfl_rampup_rounds", 0, "depthfl_rampup_rounds is 0; expected a whole number of rounds >= 1"),
    ("depthfl_temperature", 0.0, "depthfl_temperature is 0.0; expected a temperature > 0"),
    ("depthfl_lr_decay", 1.5, "depthfl_lr_decay is 1.5; expected a factor in (0, 1]"),
])
def test_options_out_of_range_are_refused_in_one_sentence(field, value, words):
    with pytest.raises(ConfigError) as caught:
        depthfl.DepthFLOptions(**{field: value})
    assert str(caught.value) == words


def test_a_depth_the_model_lacks_is_refused_in_one_sentence():
    with pytest.raises(ConfigError, match="depth 5 is not one of the model's depths; expected 1 to 4"):
        depthfl.exits_held(5, [["e1"], ["e2"], ["e3"], ["e4"]])
    assert depthfl.exits_held(2, [["e1.w", "e1.b"], ["e2.w"], ["e3"], ["e4"]]) == ["e1.w", "e1.b", "e2.w"]
