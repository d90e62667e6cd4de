"""FLuID's invariant dropout (issue 44 item 2) checked against the source's expressions, re-implemented here in the
source's numpy on Keras-layout tensors (output last, input before it) and compared with hasfl_ray's functions on
the same tensors in PyTorch's layout.

The source: github.com/iwang05/FLuID, commit 206246d03f2b3880fc76354fa120ab7c16598952,
``CIFAR10/fedDropCIFAR_android.py``. ``find_min``::

    difference[i] = np.maximum(difference[i], (np.abs(clientWeights[i] - weights[i])) / np.abs(weights[i]))
    ...
    idx0Layer = np.amax(difference[idx], axis=tuple(dim))          # dim = all but the last
    idx1Layer = difference[idx + 1]
    idx2Layer = np.amax(difference[idx + 2], axis=tuple(dim))      # dim = all but ndim - 2
    sum = np.maximum(np.maximum(idx0Layer, idx1Layer), idx2Layer)
    noChangeIdx = np.argsort(sum)
    if (rnd == 2): self.changeThreshold[idx] = sum[noChangeIdx[0]]
    if (rnd == 3): self.changeThreshold[idx] = (self.changeThreshold[idx] + sum[noChangeIdx[0]]) / 2

``find_stable``::

    difference[i] += (np.abs(clientWeights[i] - weights[i]) <= np.abs(self.changeThreshold[idx] * weights[i])) * 1
    difference[i] = difference[i] >= (0.75 * (len(results) - len(self.straggler)))
    idx0Layer = np.all(difference[idx], axis=tuple(dim)); idx1Layer = difference[idx + 1]
    idx2Layer = np.all(difference[idx + 2], axis=tuple(dim))
    noChangeIdx = idx0Layer & idx1Layer & idx2Layer
    # last conv: reducedList[i] = np.all(idx2Layer[i * 4 * 4: i * 4 * 4 + 4 * 4])

``drop_dynamic`` (per layer) and ``aggregate_drop`` are transcribed in the tests below.
"""

import random

import numpy as np
import pytest
import torch

from hasfl_ray.algorithms.league import fluid
from hasfl_ray.errors import ConfigError


def _keras_to_torch(a):
    """HWIO kernel -> OIHW; (in, out) dense -> (out, in); 1-D unchanged."""
    if a.ndim == 4:
        return torch.from_numpy(np.ascontiguousarray(np.transpose(a, (3, 2, 0, 1))))
    if a.ndim == 2:
        return torch.from_numpy(np.ascontiguousarray(a.T))
    return torch.from_numpy(a.copy())


def _layers(rng, spatial=False):
    """A layer (kernel, bias) and the next kernel, Keras layout: conv->conv, or conv->dense over 2x2 positions."""
    kernel = rng.normal(size=(3, 3, 2, 4))
    bias = rng.normal(size=(4,))
    nxt = rng.normal(size=(4 * 4, 6)) if spatial else rng.normal(size=(3, 3, 4, 5))
    return [kernel, bias, nxt]


def _clients(rng, weights, count=4, scale=0.3):
    return [[w + scale * rng.normal(size=w.shape) * (rng.random(size=w.shape) < 0.5) for w in weights]
            for _ in range(count)]


def test_neuron_change_and_calibration_are_find_mins():
    rng = np.random.default_rng(0)
    weights = _layers(rng)
    clients = _clients(rng, weights)
    difference = [np.full(w.shape, 0.0) for w in weights]
    for cw in clients:
        for i in range(len(weights)):
            difference[i] = np.maximum(difference[i], np.abs(cw[i] - weights[i]) / np.abs(weights[i]))
    idx0 = np.amax(difference[0], axis=(0, 1, 2))
    idx1 = difference[1]
    idx2 = np.amax(difference[2], axis=(0, 1, 3))
    total = np.maximum(np.maximum(idx0, idx1), idx2)
    smallest = total[np.argsort(total)[0]]

    changes = [fluid.relative_change(_keras_to_torch(w), [_keras_to_torch(c[i]) for c in clients])
               for i, w in enumerate(weights)]
    got = fluid.neuron_change(*changes)
    np.testing.assert_allclose(got.numpy(), total)
    assert fluid.smallest_change(got) == pytest.approx(smallest)
    assert fluid.calibrate(2, 1.5, smallest) == smallest
    assert fluid.calibrate(3, 0.4, smallest) == pytest.approx((0.4 + smallest) / 2)
    assert fluid.calibrate(4, 0.4, smallest) == 0.4


def test_smallest_change_sorts_nan_last_as_argsort_does():
    values = np.array([np.nan, 0.3, 0.1, np.inf])
    assert fluid.smallest_change(torch.from_numpy(values)) == values[np.argsort(values)[0]] == 0.1


@pytest.mark.parametrize("spatial", [False, True])
def test_invariant_neurons_are_find_stables(spatial):
    rng = np.random.default_rng(1 if spatial else 2)
    weights = _layers(rng, spatial)
    clients = []
    for k in range(5):  # tiny relative moves everywhere; neuron 1 moved by all, neuron 0 by one client only,
        moved = [w * (1 + 0.01 * rng.normal(size=w.shape)) for w in weights]  # neuron 3's bias by two
        moved[0][..., 1] += 1.0
        if k == 0:
            moved[0][..., 0] += 1.0
        if k in (1, 2):
            moved[1][3] += 1.0
        clients.append(moved)
    threshold, stragglers, results = 0.12, 1, 5 + 1  # one straggler reported too and is left out of the votes
    difference = [np.full(w.shape, 0) for w in weights]
    for cw in clients:
        for i in range(len(weights)):
            difference[i] += (np.abs(cw[i] - weights[i]) <= np.abs(threshold * weights[i])) * 1
    difference = [d >= 0.75 * (results - stragglers) for d in difference]
    idx0 = np.all(difference[0], axis=(0, 1, 2))
    idx1 = difference[1]
    if spatial:  # the last conv: classifier rows 4c .. 4c+3 (the source's 16 for its 4x4 map)
        idx2 = np.all(difference[2], axis=(1,))
        reduced = np.array([np.all(idx2[i * 4:i * 4 + 4]) for i in range(len(idx0))], dtype=bool)
    else:
        reduced = np.all(difference[2], axis=(0, 1, 3))
    expected = [i for i, flag in enumerate(idx0 & idx1 & reduced) if flag]

    votes = [fluid.invariant_votes(_keras_to_torch(w), [_keras_to_torch(c[i]) for c in clients], threshold)
             for i, w in enumerate(weights)]
    got = fluid.invariant_neurons(*votes, voters=results - stragglers, quorum=0.75, spatial=4 if spatial else 1)
    assert got == expected == [0, 2]


def _source_drop_dynamic(C, p, unchanged, def_drop, rng, idx=1):
    """``drop_dynamic``'s selection for one layer of ``idxList``, as the source writes it."""
    stop = False
    numToDrop = C - int(p * C)
    if len(def_drop) >= numToDrop:
        if idx == 0:
            stop = True
        dropList = sorted(rng.sample(def_drop, numToDrop))
    elif len(unchanged) >= numToDrop:
        stop = True
        fullList = unchanged.copy()
        for x in def_drop:
            fullList.remove(x)
        dropList = rng.sample(fullList, numToDrop - len(def_drop))
        dropList.extend(def_drop)
        dropList.sort()
    else:
        fullList = [x for x in range(C)]
        for x in unchanged:
            fullList.remove(x)
        dropList = rng.sample(fullList, numToDrop - len(unchanged))
        dropList.extend(unchanged)
        dropList.sort()
    return dropList, stop


@pytest.mark.parametrize("unchanged, def_drop, idx", [
    ([1, 4, 7, 9, 12, 15, 20], [4, 9, 12, 15], 0),   # enough certain drops (first layer: stops)
    ([1, 4, 7, 9, 12, 15, 20], [4, 9, 12, 15], 2),   # enough certain drops (not first: keeps growing)
    ([1, 4, 7, 9, 12, 15, 20], [9], 1),              # enough invariant ones
    ([3, 11], [11], 1),                              # too few: invariant plus random others
])
def test_dropped_neurons_are_drop_dynamics_draws(unchanged, def_drop, idx):
    C, p = 24, 0.85  # drops 24 - int(20.4) = 4
    expected = _source_drop_dynamic(C, p, unchanged, def_drop, random.Random(7), idx)
    got = fluid.choose_dropped(C, p, unchanged, def_drop, random.Random(7), first_layer=idx == 0)
    assert got == expected and len(got[0]) == fluid.dropped_count(C, p) == 4


def test_certain_drops_are_last_rounds_drops_still_invariant():
    assert fluid.certain_drops([8, 2, 5], [1, 2, 3, 8]) == [8, 2]


@pytest.mark.parametrize("ratio, p", [(0.95, 0.95), (0.9, 0.95), (0.85, 0.85), (0.72, 0.75), (0.6, 0.65),
                                      (0.59, 0.5)])
def test_straggler_p_is_aggregate_fits_table(ratio, p):
    assert fluid.straggler_fraction(ratio * 10.0, 10.0) == p


class _Source:
    """``aggregate_fit``'s straggler block, as the source writes it (results: [(cid, duration)])."""

    def __init__(self):
        self.straggler, self.p_val, self.JustUpdatedStrag = {}, 0.95, False

    def _p(self, percentDiff):
        if (percentDiff >= 0.90):
            return 0.95
        elif (percentDiff < 0.90 and percentDiff >= 0.80):
            return 0.85
        elif (percentDiff < 0.80 and percentDiff >= 0.70):
            return 0.75
        elif (percentDiff < 0.70 and percentDiff >= 0.60):
            return 0.65
        return 0.5

    def step(self, rnd, results):
        results = list(results)
        if (len(self.straggler) == 0) and rnd > 1:
            results.sort(key=lambda e: e[1])
            self.straggler[results[len(results) - 1][0]] = results[len(results) - 1][1]
            self.p_val = self._p(results[len(results) - 2][1] / results[len(results) - 1][1])
        elif (len(self.straggler) != 0) and rnd > 1 and self.JustUpdatedStrag == False:  # noqa: E712
            results.sort(key=lambda e: e[1])
            slowest = results[len(results) - 1]
            if (slowest[0] not in self.straggler):
                for i in range(len(results)):
                    if results[i][0] in self.straggler:
                        self.straggler[results[i][0]] = (results[i][1] / self.p_val) * 1.15
                stragglerList = list(self.straggler.items())
                if (slowest[1] > stragglerList[0][1]):
                    self.straggler[slowest[0]] = slowest[1]
                    self.p_val = self._p(stragglerList[0][1] / slowest[1])
                    self.JustUpdatedStrag = True
                    self.straggler.pop(stragglerList[0][0])
        else:
            self.JustUpdatedStrag = False


def test_stragglers_are_chosen_and_re_chosen_as_aggregate_fit_does():
    rng = np.random.default_rng(4)
    source, state = _Source(), fluid.Stragglers()
    changes = 0
    for rnd in range(1, 40):
        durations = [(str(c), float(t)) for c, t in enumerate(rng.uniform(5, 10, size=5))]
        if rnd % 7 == 0:
            durations[rnd % 5] = (durations[rnd % 5][0], 30.0)  # a client turns slow
        source.step(rnd, durations)
        before = list(state.times)
        state, removed = fluid.track_stragglers(rnd, durations, state)
        changes += bool(removed)
        assert state.times == source.straggler and list(state.times) == list(source.straggler)
        assert state.p == source.p_val and state.just_updated == source.JustUpdatedStrag
        assert removed == [c for c in before if c not in state.times]
    assert changes >= 2


def test_threshold_schedule_is_aggregate_fits_loop():
    idxlist = [0, 2, 4]
    change, stop, counter = {0: 0.1, 2: 0.2, 4: 0.3}, {0: False, 2: True, 4: False}, 0
    mine, my_counter = [0.1, 0.2, 0.3], 0
    for rnd in range(1, 30):
        if rnd == 17:
            stop[0] = True  # a layer stops growing midway (drop_dynamic's side effect)
        if (rnd > 10):  # the source's lines
            counter += 1
            if (counter >= 2):
                for idx in idxlist:
                    if not stop[idx]:
                        change[idx] += 0.2
                        counter = 0
        mine, my_counter = fluid.advance(rnd, mine, [stop[i] for i in idxlist], my_counter)
        assert mine == [change[i] for i in idxlist] and my_counter == counter


def test_threshold_schedule_adds_the_increment_every_second_round_after_round_ten():
    thresholds, counter, seen = [0.1, 0.2], 0, []
    for rnd in range(1, 17):
        thresholds, counter = fluid.advance(rnd, thresholds, [False, True], counter)
        seen.append(round(thresholds[0], 6))
    assert seen == [0.1] * 11 + [0.3, 0.3, 0.5, 0.5, 0.7]
    assert thresholds[1] == 0.2  # a stopped layer stays


def test_aggregation_is_aggregate_drops_example_weighted_mean_over_holders():
    rng = np.random.default_rng(3)
    shape = (3, 3, 5, 6)  # Keras conv: in 5, out 6
    full = [rng.normal(size=shape) for _ in range(3)]
    n = [10, 30, 20]
    rows, cols = [1, 4], [0, 3]  # client 2 (a straggler) dropped outputs 1, 4 and inputs 0, 3
    total = np.full(shape, float(sum(n)))
    total[..., rows] -= n[2]
    total[..., cols, :] -= n[2]
    total[np.ix_(range(3), range(3), cols, rows)] += n[2]
    zero_filled = full[2].copy()
    zero_filled[..., rows] = 0
    zero_filled[..., cols, :] = 0
    expected = (full[0] * n[0] + full[1] * n[1] + zero_filled * n[2]) / total

    held = [torch.ones(6, 5, 3, 3, dtype=torch.bool)] * 2 + [fluid.held_mask((6, 5, 3, 3), rows, cols)]
    got = fluid.aggregate(torch.zeros(6, 5, 3, 3), [_keras_to_torch(w) for w in full], held, n)
    np.testing.assert_allclose(got.numpy(), _keras_to_torch(expected).numpy())


def test_draws_come_from_the_algorithm_stream_of_seed_round_and_client():
    a = fluid.draws(1, 5, 3).sample(range(100), 5)
    assert a == fluid.draws(1, 5, 3).sample(range(100), 5)
    assert a != fluid.draws(1, 6, 3).sample(range(100), 5)


@pytest.mark.parametrize("field, value, words", [
    ("fluid_quorum", 0.0, "fluid_quorum is 0.0; expected a fraction in (0, 1]"),
    ("fluid_quorum", 1.5, "fluid_quorum is 1.5; expected a fraction in (0, 1]"),
    ("fluid_increment_every", 0, "fluid_increment_every is 0; expected a whole number of rounds >= 1"),
    ("fluid_initial_threshold", -1.0, "fluid_initial_threshold is -1.0; expected a number >= 0"),
    ("fluid_time_margin", 0, "fluid_time_margin is 0; expected a number > 0"),
])
def test_options_out_of_range_are_refused_in_one_sentence(field, value, words):
    with pytest.raises(ConfigError) as caught:
        fluid.FLuIDOptions(**{field: value})
    assert str(caught.value) == words


def test_a_next_layer_of_the_wrong_width_is_refused_in_one_sentence():
    with pytest.raises(ConfigError, match="the next layer has 7 inputs; expected 4 neurons x 1 spatial positions"):
        fluid.neuron_change(torch.zeros(4, 2), torch.zeros(4), torch.zeros(3, 7))
