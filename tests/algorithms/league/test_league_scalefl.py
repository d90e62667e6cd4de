"""ScaleFL's rules (issue 44 item 2) checked against the source's expressions, re-implemented here from the source.

The source: github.com/git-disl/scale-fl, commit c2084e461cef83751b99a958198aced66c1d7d7c.
``models/model_utils.py::KDLoss`` (``self.kld_loss = nn.KLDivLoss()``, ``T = args.KD_T``, ``gamma = args.KD_gamma``)::

    def loss_fn_kd(self, pred, target, soft_target, gamma_active=True):
        _ce = self.ce_loss(pred, target)
        T = self.T
        if self.gamma and gamma_active:
            _kld = self.kld_loss(self.log_softmax(pred / T), self.softmax(soft_target / T)) * self.gamma * T * T
        else:
            _kld = 0
        loss = _ce + _kld

``train.py::execute_epoch``::

    for j in range(len(output)):
        if j == len(output) - 1:
            loss += criterion.ce_loss(output[j], target) * (j + 1)
        else:
            gamma_active = round > args.num_rounds * 0.25
            loss += criterion.loss_fn_kd(output[j], target, output[-1], gamma_active) * (j + 1)
    loss /= len(output) * (len(output) + 1) / 2

``fed.py::Federator.fed_train``::

    np.random.seed(args.seed)
    shuffled_client_idxs = np.random.permutation(client_idxs)
    for ratio in self.client_split_ratios:
        e = s + int(len(shuffled_client_idxs) * ratio)
        client_groups.append(shuffled_client_idxs[s: e]); s = e

``fed.py::Federator.average_weights``::

    if 'num_batches_tracked' in key: w_avg[key] = w[0][key]; continue
    if 'running' in key: w_avg[key] = sum([w_[key] for w_ in w]) / len(w); continue
    tmp = torch.zeros_like(w_avg[key]); count = torch.zeros_like(tmp)
    for i in range(len(w)):
        if grad_flags[i][key]:
            idx = self.idx_dicts[levels[i]][key]          # (after fix_idx_array) a bool mask
            tmp[idx] += w[i][key].flatten(); count[idx] += 1
    w_avg[key][count != 0] = tmp[count != 0]
    count[count == 0] = 1
    w_avg[key] = w_avg[key] / count
"""

import numpy as np
import pytest
import torch
from torch import nn

from hasfl_ray.algorithms.league import scalefl
from hasfl_ray.errors import ConfigError


def _source_loss(output, target, gamma, T, round, num_rounds):
    ce, kld = nn.CrossEntropyLoss(), nn.KLDivLoss()

    def loss_fn_kd(pred, target, soft_target, gamma_active=True):
        _ce = ce(pred, target)
        if gamma and gamma_active:
            _kld = kld(nn.LogSoftmax(dim=1)(pred / T), nn.Softmax(dim=1)(soft_target / T)) * gamma * T * T
        else:
            _kld = 0
        return _ce + _kld

    loss = 0.0
    for j in range(len(output)):
        if j == len(output) - 1:
            loss += ce(output[j], target) * (j + 1)
        else:
            gamma_active = round > num_rounds * 0.25
            loss += loss_fn_kd(output[j], target, output[-1], gamma_active) * (j + 1)
    loss /= len(output) * (len(output) + 1) / 2
    return loss


# nn.KLDivLoss()'s 'mean' warns that a later PyTorch will make it 'batchmean'; the source ran with the element mean
@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss")
@pytest.mark.parametrize("gamma, round, exits", [(0.0, 90, 4), (0.05, 10, 4), (0.05, 90, 4), (0.5, 90, 3),
                                                 (0.5, 90, 1)])
def test_the_exit_loss_and_its_gradients_are_execute_epochs(gamma, round, exits):
    torch.manual_seed(exits)
    outputs = [torch.randn(4, 10, requires_grad=True) for _ in range(exits)]
    target = torch.randint(0, 10, (4,))
    expected = _source_loss(outputs, target, gamma, 3, round, 100)
    expected.backward()
    want = [x.grad.clone() for x in outputs]
    for x in outputs:
        x.grad = None
    got = scalefl.exit_loss(outputs, target, gamma, 3.0, scalefl.distillation_active(round, 100))
    got.backward()
    torch.testing.assert_close(got, expected)
    for x, g in zip(outputs, want):
        torch.testing.assert_close(x.grad, g)


def test_the_kl_term_is_the_mean_over_batch_and_classes_not_batchmean():
    torch.manual_seed(2)
    pred, teacher = torch.randn(4, 10), torch.randn(4, 10)
    q = torch.softmax(teacher / 3, dim=1)
    per_element = q * (q.log() - torch.log_softmax(pred / 3, dim=1))
    torch.testing.assert_close(scalefl.kl_elementwise_mean(pred, teacher, 3.0), per_element.sum() / 40)


def test_the_deepest_exit_is_trained_by_the_distillation_term_too():
    torch.manual_seed(9)
    outputs = [torch.randn(4, 10, requires_grad=True) for _ in range(2)]
    target = torch.randint(0, 10, (4,))
    with_kd = torch.autograd.grad(scalefl.exit_loss(outputs, target, 0.5, 3.0, True), outputs[-1])[0]
    without = torch.autograd.grad(scalefl.exit_loss(outputs, target, 0.0, 3.0, True), outputs[-1])[0]
    assert not torch.allclose(with_kd, without)  # the teacher is not detached


@pytest.mark.parametrize("num_clients, ratios", [(100, [0.25] * 4), (10, [0.25] * 4), (7, [0.5, 0.5])])
def test_levels_are_fed_trains_groups(num_clients, ratios):
    np.random.seed(42)
    shuffled = np.random.permutation(np.arange(num_clients))
    expected, s = [], 0
    for ratio in ratios:
        e = s + int(len(shuffled) * ratio)
        expected.append(shuffled[s:e])
        s = e
    got = scalefl.level_groups(num_clients, ratios, 42)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))
    left_over = [c for c in range(num_clients) if scalefl.level_of(c, got) == -1]
    assert len(left_over) == num_clients - sum(int(num_clients * r) for r in ratios)


@pytest.mark.parametrize("num_clients, seed", [(10, 0), (7, 3), (100, 0)])
def test_a_left_over_client_trains_as_the_last_level(num_clients, seed):
    """fed.py (c2084e461cef): ``get_level`` answers −1 for a client in no group ("client will be skipped"), and
    ``execute_round`` uses that −1 as an index: ``scales = [self.vertical_scale_ratios[level] ...]``,
    ``h_scale_ratios = [self.horizontal_scale_ratios[level] ...]``, ``average_weights`` reads
    ``self.idx_dicts[levels[i]]``; so the client trains the last level's width and exits and is averaged at its
    coordinates, never skipped (run on the source's Federator: 2 of 10 clients left over, both at width 1, 4 exits)."""
    vertical, horizontal = [0.25, 0.5, 0.75, 1.0], [1, 2, 3, 4]
    groups = scalefl.level_groups(num_clients, [0.25] * 4, seed)
    for client in range(num_clients):
        level = scalefl.level_of(client, groups)  # get_level's answer, −1 included
        got = scalefl.trained_level(client, groups)
        assert (vertical[got], horizontal[got]) == (vertical[level], horizontal[level])
        assert got == (level if level >= 0 else len(groups) - 1)
    assert num_clients % 4 == 0 or any(scalefl.level_of(c, groups) == -1 for c in range(num_clients))


def test_scaled_channels_are_the_models_floor():
    assert [scalefl.scaled_channels(c, 0.7) for c in (16, 32, 64)] == [int(16 * 0.7), int(32 * 0.7), int(64 * 0.7)]
    assert scalefl.scaled_channels(64, 1) == 64


def test_aggregation_is_average_weights():
    torch.manual_seed(5)
    glob = {"conv.weight": torch.randn(6, 4, 3, 3), "bn.running_mean": torch.randn(6),
            "bn.num_batches_tracked": torch.tensor(0)}
    shapes = [(4, 2, 3, 3), (6, 4, 3, 3), (4, 2, 3, 3)]
    clients = [{"conv.weight": torch.randn(*s), "bn.running_mean": torch.randn(6),
                "bn.num_batches_tracked": torch.tensor(7 + i)} for i, s in enumerate(shapes)]
    trained = [{"conv.weight": True}, {"conv.weight": True}, {"conv.weight": False}]

    w_avg = {k: v.clone() for k, v in glob.items()}
    key = "conv.weight"
    tmp, count = torch.zeros_like(w_avg[key]), torch.zeros_like(w_avg[key])
    for i in range(3):
        if trained[i][key]:
            idx = scalefl.leading_mask(glob[key].shape, shapes[i])
            tmp[idx] += clients[i][key].flatten()
            count[idx] += 1
    w_avg[key][count != 0] = tmp[count != 0]
    count[count == 0] = 1
    w_avg[key] = w_avg[key] / count
    w_avg["bn.running_mean"] = sum(c["bn.running_mean"] for c in clients) / 3
    w_avg["bn.num_batches_tracked"] = clients[0]["bn.num_batches_tracked"]

    got = scalefl.aggregate(glob, clients, trained)
    for name in glob:
        torch.testing.assert_close(got[name], w_avg[name])


def test_a_level_tensor_larger_than_the_global_one_is_refused_in_one_sentence():
    with pytest.raises(ConfigError, match=r"of shape \(7, 2\) does not fit in the global \(6, 2\)"):
        scalefl.leading_mask((6, 2), (7, 2))


@pytest.mark.parametrize("field, value, words", [
    ("scalefl_exits", "1,3,2", "scalefl_exits is '1,3,2'; expected comma-separated numbers of exits per level"),
    ("scalefl_exits", "0,1", "scalefl_exits is '0,1'; expected"),
    ("scalefl_kd_gamma", -0.1, "scalefl_kd_gamma is -0.1; expected a number >= 0"),
    ("scalefl_kd_temperature", 0, "scalefl_kd_temperature is 0; expected a temperature > 0"),
    ("scalefl_kd_start", 1.5, "scalefl_kd_start is 1.5; expected a fraction of the rounds in [0, 1]"),
])
def test_options_out_of_range_are_refused_in_one_sentence(field, value, words):
    with pytest.raises(ConfigError) as caught:
        scalefl.ScaleFLOptions(**{field: value})
    assert str(caught.value).startswith(words) and "\n" not in str(caught.value)


class _Meter:
    """utils/utils.py::AverageMeter as the source writes it (val, sum, count, avg)."""

    def __init__(self):
        self.sum, self.count, self.avg = 0.0, 0, 0.0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def test_the_reported_accuracy_is_the_mean_of_the_exits():
    """predict.py::validate (c2084e461cef) keeps ``top1 = [[AverageMeter()] * num_exits[i] for i in ...]`` (one
    meter repeated), updates ``top1[model_idx][j].update(prec1.item(), inp.size(0))`` for every exit j and reports
    ``top1[0][-1].avg``: the mean of the exits' accuracies (run on the source: 15.6, 4.7, 14.1, 6.25 % per exit
    reported as 10.16 %), which is what its global and per-level figures are."""
    torch.manual_seed(11)
    batches = [[torch.randn(b, 10) for _ in range(4)] for b in (16, 16, 9)]
    targets = [torch.randint(0, 10, (b,)) for b in (16, 16, 9)]
    meters = [_Meter()] * 4
    for outputs, target in zip(batches, targets):
        for j, out in enumerate(outputs):
            prec1 = (out.argmax(1) == target).float().sum() * (100.0 / target.size(0))
            meters[j].update(prec1.item(), target.size(0))
    deepest = 100.0 * sum((o[-1].argmax(1) == t).sum().item() for o, t in zip(batches, targets)) / 41
    got = scalefl.reported_top1(batches, targets)
    assert got == pytest.approx(meters[-1].avg, rel=1e-6)  # the source sums float32 percentages
    assert got != pytest.approx(deepest)
