"""``--algorithm fluid`` applies FLuID's rules (hasfl_ray/algorithms/league/fluid.py, transcribed from iwang05/FLuID
commit 206246d03f2b3880fc76354fa120ab7c16598952, CIFAR10/fedDropCIFAR_android.py) to a run's updates: after the
calibration of rnd 2 a straggler's channel sets leave out the channels whose updates changed least (computed here
on the digits CNN's layout, written out by hand), the stragglers' own updates never vote, and the state round-trips."""

import math

import numpy as np
import pytest
import torch

from hasfl_ray.algorithms.fluid import FLuID
from hasfl_ray.engine import RunConfig
from hasfl_ray.models import build_model
from hasfl_ray.training.result import ClientResult


#: The digits CNN's channel groups written out: per group, (parameter, dim, positions per channel).
LAYOUT = [[("features.0.weight", 0, 1), ("features.0.bias", 0, 1), ("features.1.weight", 0, 1),
           ("features.1.bias", 0, 1), ("features.4.weight", 1, 1)],
          [("features.4.weight", 0, 1), ("features.4.bias", 0, 1), ("features.5.weight", 0, 1),
           ("features.5.bias", 0, 1), ("fc1.weight", 1, 4)],
          [("fc1.weight", 0, 1), ("fc1.bias", 0, 1), ("fc2.weight", 1, 1)]]
SIZES = [32, 64, 128]
#: The channels of each group whose weights the non-stragglers leave exactly as they were.
STILL = [[1, 7, 20], [0, 5, 6, 63], [3, 100]]


def select(tensor, dim, unit, channels):
    positions = [c * unit + k for c in channels for k in range(unit)]
    return tensor.index_select(dim, torch.tensor(positions))


def round_updates(global_params, clients, generator):
    """Per client a dense update: exactly 0 on every coordinate of a STILL channel, else |Δ| >= 0.5 |w|."""
    updates = []
    for _ in clients:
        update = {}
        for name, w in global_params.items():
            factor = (0.5 + torch.rand(w.shape, generator=generator)) * torch.where(
                torch.rand(w.shape, generator=generator) < 0.5, -1.0, 1.0)
            update[name] = w * factor
        for group, slices in enumerate(LAYOUT):
            for name, dim, unit in slices:
                positions = [c * unit + k for c in STILL[group] for k in range(unit)]
                update[name].index_fill_(dim, torch.tensor(positions), 0.0)
        updates.append(update)
    return [ClientResult(c, 1.0, u, 10, 1.0, 1) for c, u in zip(clients, updates)]


def changes_by_hand(global_params, results):
    """Per group, per channel: max over clients and over the channel's weights of |w_i − w| / |w|."""
    out = []
    for group, slices in enumerate(LAYOUT):
        per = []
        for c in range(SIZES[group]):
            worst = 0.0
            for r in results:
                for name, dim, unit in slices:
                    w = select(global_params[name], dim, unit, [c]).double()
                    d = select(r.update[name], dim, unit, [c]).double()
                    worst = max(worst, float((d.abs() / w.abs()).max()))
            per.append(worst)
        out.append(per)
    return out


@pytest.fixture
def fluid():
    config = RunConfig(dataset="digits", algorithm="fluid", clients=4, clients_per_round=4, rounds=5, seed=3)
    algorithm = FLuID(config, np.array([1.0, 1.0, 1.0, 0.5]), np.array([10, 10, 10, 10]))
    algorithm.model_name = "digits"
    return algorithm


def test_a_straggler_drops_the_least_changed_channels_after_calibration(fluid):
    generator = torch.Generator().manual_seed(5)
    global_params = {n: torch.randn(s.shape, generator=generator) + 0.1 for n, s in
                     build_model("digits").param_specs().items()}
    assert fluid.allocate(0, [0, 1, 2, 3]) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}  # rnd 1: everyone full
    fluid.inspect_updates(0, global_params, round_updates(global_params, [0, 1, 2, 3], generator))
    assert fluid.thresholds == [1.5, 1.5, 1.5]  # rnd 1: no calibration
    assert fluid.allocate(1, [0, 1, 2, 3]) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}  # rnd 2: still full
    results = round_updates(global_params, [0, 1, 2], generator)
    straggler = round_updates(global_params, [3], torch.Generator().manual_seed(6))[0]
    for name in straggler.update:  # the straggler changes everything; its update must not vote
        straggler.update[name] = global_params[name] * 0.9
    fluid.inspect_updates(1, global_params, results + [straggler])
    by_hand = changes_by_hand(global_params, results)
    for group, per in enumerate(by_hand):
        least = [c for c, value in enumerate(per) if value == min(per)]
        assert least == STILL[group] and min(per) == 0.0
        assert fluid.thresholds[group] == min(per)  # rnd 2: the smallest channel change
    assert fluid.allocate(2, [0, 1, 2, 3]) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.5}  # rnd 3: the straggler drops
    fluid.inspect_updates(2, global_params, round_updates(global_params, [0, 1, 2], generator))
    assert fluid.invariant == STILL  # rnd 3: judged with rnd 2's calibrated threshold, 0
    widths = fluid.allocate(3, [0, 1, 2, 3])  # rnd 4
    assert widths == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.5}
    kept = fluid.channel_sets(3, 3, 0.5)
    assert fluid.channel_sets(3, 0, 1.0) is None
    for group, size in enumerate(SIZES):
        assert len(kept[group]) == math.ceil(0.5 * size) and kept[group] == sorted(kept[group])
        assert not set(kept[group]) & set(STILL[group])  # every invariant channel dropped (fewer than D of them)
    assert fluid.previous[3] == [sorted(set(range(s)) - set(k)) for s, k in zip(SIZES, kept)]


def test_invariance_is_judged_with_the_threshold_before_the_rounds_calibration(fluid):
    """iwang05/FLuID @ 206246d03f2b, CIFAR10/fedDropCIFAR_android.py::aggregate_fit calls find_stable (the
    invariant neurons, with changeThreshold as it stands) before find_min (which sets it to the smallest neuron
    change at rnd 2 and averages at rnd 3): the rnd-2 invariant neurons are judged with the initial 1.5, the rnd-3
    ones with rnd 2's calibrated value; the rnd-3 straggler, finding at least D invariant neurons, drops among them
    and stops the layer's threshold."""
    generator = torch.Generator().manual_seed(5)
    global_params = {n: torch.randn(s.shape, generator=generator) + 0.1 for n, s in
                     build_model("digits").param_specs().items()}

    def halves(clients):  # every weight moved by half of itself, the STILL channels not at all
        results = round_updates(global_params, clients, generator)
        for result in results:
            for name, update in result.update.items():
                update.copy_(torch.where(update == 0, 0.0, 0.5 * global_params[name]))
        return results

    for t in range(2):
        fluid.allocate(t, [0, 1, 2, 3])
        fluid.inspect_updates(t, global_params, halves([0, 1, 2]))
    assert fluid.thresholds == [0.0, 0.0, 0.0]  # rnd 2's calibration: the STILL channels' change
    assert fluid.invariant == [list(range(size)) for size in SIZES]  # every change 0.5 <= 1.5: all invariant
    fluid.allocate(2, [0, 1, 2, 3])
    # drop_dynamic's second branch (enough invariant neurons) stops a layer; the last conv's branch never does
    assert fluid.stopped == [True, False, True]
    fluid.inspect_updates(2, global_params, halves([0, 1, 2]))
    assert fluid.invariant == STILL  # rnd 3: judged with 0, only the unmoved channels
    assert fluid.thresholds == [0.0, 0.0, 0.0]  # (0 + 0) / 2


def test_the_draws_and_the_state_round_trip(fluid):
    generator = torch.Generator().manual_seed(5)
    global_params = {n: torch.randn(s.shape, generator=generator) + 0.1 for n, s in
                     build_model("digits").param_specs().items()}
    for t in range(2):
        fluid.allocate(t, [0, 1, 2, 3])
        fluid.inspect_updates(t, global_params, round_updates(global_params, [0, 1, 2], generator))
    state = fluid.state_dict()
    twin = FLuID(fluid.config, fluid.p_max, fluid.num_samples)
    twin.model_name = "digits"
    twin.load_state_dict(state)
    assert twin.allocate(2, [1, 3]) == fluid.allocate(2, [1, 3])
    assert twin.channel_sets(2, 3, 0.5) == fluid.channel_sets(2, 3, 0.5)
    assert twin.state_dict()["fluid"] == fluid.state_dict()["fluid"]


@pytest.mark.parametrize("arch", ["preresnet18", "resnet18"])
def test_fluid_on_a_resnet_drops_per_residual_stream_and_the_straggler_trains_its_sets(arch):
    """On a ResNet a neuron is a channel of a stage's residual stream or of a block's inner activation: the
    straggler's sets (one per group, ceil(p x C) each) train as the index-set sub-network."""
    from hasfl_ray.data.base import TensorFederatedDataset
    from hasfl_ray.engine.guard import GuardedAlgorithm
    from hasfl_ray.models import register_model
    from hasfl_ray.models.index_slicing import channel_groups
    from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer

    model = f"h15-fluid-{arch}"
    register_model(model, dict(kind=arch, in_channels=1, num_classes=10, image_size=8, norm="sbn", scaler=True,
                               stages=[8, 8, 16, 16]))
    config = RunConfig(dataset="digits", algorithm="fluid", clients=4, clients_per_round=4, rounds=5, seed=3)
    algorithm = FLuID(config, np.array([1.0, 1.0, 1.0, 0.25]), np.array([10, 10, 10, 10]))
    algorithm.model_name = model
    generator = torch.Generator().manual_seed(2)
    specs = build_model(model).param_specs()
    global_params = {n: torch.randn(s.shape, generator=generator) + 0.1 for n, s in specs.items()}
    for t in range(2):
        algorithm.allocate(t, [0, 1, 2, 3])
        results = [ClientResult(c, 1.0, {n: w * torch.rand(w.shape, generator=generator) for n, w in
                                         global_params.items()}, 10, 1.0, 1) for c in range(3)]
        algorithm.inspect_updates(t, global_params, results)
    _, sizes = channel_groups(specs)
    assert len(algorithm.invariant) == len(sizes) == 12
    assert algorithm.allocate(2, [0, 3]) == {0: 1.0, 3: 0.25}
    guarded = GuardedAlgorithm(algorithm, "fluid", 4)
    sets = guarded.channel_sets(2, 3, 0.25)  # the guard's checks: groups, order, range, ceil(p x C) each
    assert [len(s) for s in sets] == [2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4]
    x = torch.randint(0, 256, (40, 1, 8, 8), dtype=torch.uint8, generator=generator)
    y = torch.randint(0, 10, (40,), generator=generator)
    dataset = TensorFederatedDataset("tiny", model, 10, x, y, x[:8], y[:8], [torch.arange(40)], mean=[0.5], std=[0.25])
    result = Trainer(dataset, model, OptimizerSettings(batch_size=16)).train(
        ClientTask(0, 2, 0.25, 0.05, 3, channels=sets), global_params)
    assert result.steps > 0 and all(torch.isfinite(u.values).all() for u in result.update.values())


RECORDING = '''
from hasfl_ray.algorithms.fluid import FLuID


class Recording(FLuID):
    """FLuID, keeping what each round inspected and handed out (for the test)."""

    def allocate(self, round, participants):
        widths = super().allocate(round, participants)
        self.__dict__.setdefault("handed", {})[round] = {c: [list(g) for g in s] for c, s in self._sets.items()}
        return widths

    def inspect_updates(self, round, global_params, results):
        seen = (round, {k: v.clone() for k, v in global_params.items()},
                [(r.client, r.width, dict(r.update)) for r in results])
        super().inspect_updates(round, global_params, results)
        self.__dict__.setdefault("seen", []).append(seen + (list(self.thresholds), self.invariant))
'''


def invariant_by_hand(global_params, updates, thetas, quorum=0.75):
    """Per group, the channels each of whose weights is within |theta w| of w for at least quorum x voters."""
    out = []
    for group, slices in enumerate(LAYOUT):
        channels = []
        for c in range(SIZES[group]):
            steady = True
            for name, dim, unit in slices:
                w = select(global_params[name], dim, unit, [c])
                votes = sum(((select(u[name], dim, unit, [c]) + w).double() - w.double()).abs()
                            <= (thetas[group] * w.double()).abs() for u in updates)
                steady = steady and bool((votes >= quorum * len(updates)).all())
            if steady:
                channels.append(c)
        out.append(channels)
    return out


def test_in_a_run_the_straggler_drops_the_channels_that_changed_least(tmp_path):
    """A real run (digits, 4 clients each round, the p^max 0.25 client the straggler), the non-stragglers' real
    updates checked by hand: the rnd-2 thresholds are the smallest channel changes, the rnd-2 invariant channels are
    judged with the initial 1.5 and the rnd-3 ones with rnd 2's threshold (find_stable runs before find_min), and
    the straggler's rnd-4 sets drop among the invariant channels, or every one of them when there are fewer than D."""
    from hasfl_ray.engine import Engine

    (tmp_path / "recording.py").write_text(RECORDING)
    config = RunConfig(dataset="digits", algorithm=f"{tmp_path / 'recording.py'}:Recording", clients=4,
                       clients_per_round=4, rounds=4, seed=3, tier_counts=[1, 1, 1, 1], backend="local",
                       checkpoint_every=0)
    engine = Engine(config, out_dir=str(tmp_path / "run"))
    engine.run()
    algorithm = engine.algorithm.algorithm
    straggler = int(np.flatnonzero(algorithm.p_max == 0.25)[0])
    assert algorithm.seen[0][3] == [1.5, 1.5, 1.5]  # rnd 1: no calibration
    round_, global_params, results, thresholds, invariant = algorithm.seen[1]
    assert round_ == 1 and {c for c, _, _ in results} == {0, 1, 2, 3}
    voters = [r for r in results if r[0] != straggler]
    by_hand = changes_by_hand(global_params, [ClientResult(c, w, u, 10, 1.0, 1) for c, w, u in voters])
    for group, per in enumerate(by_hand):
        assert thresholds[group] == pytest.approx(min(per), rel=1e-12)
    assert invariant == invariant_by_hand(global_params, [u for _, _, u in voters], [1.5, 1.5, 1.5])
    round_, global_params, results, _, invariant = algorithm.seen[2]
    voters = [u for c, _, u in results if c != straggler]
    assert round_ == 2 and len(voters) == 3
    assert invariant == invariant_by_hand(global_params, voters, thresholds)
    kept = algorithm.handed[3][straggler]
    for group, size in enumerate(SIZES):
        assert len(kept[group]) == math.ceil(0.25 * size)
        dropped, steady = set(range(size)) - set(kept[group]), set(invariant[group])
        assert dropped <= steady if len(steady) >= len(dropped) else steady <= dropped
    assert set(algorithm.handed[2]) == {straggler} and algorithm.handed[1] == {}


def test_with_the_clock_the_slowest_client_of_rnd_2_becomes_the_straggler():
    """The device clock's seconds stand for the source's durations: the slowest of the round at rnd 2, p from the
    next-slowest's ratio (``straggler_fraction``); a round of one accepted client changes nothing."""
    from hasfl_ray.algorithms.league.fluid import straggler_fraction

    class Clock:  # each client's seconds: 10, 11, 12, 20 (client 3 the slowest)
        def base_cost(self, client, width, depth=None):
            return client

        def seconds(self, client, cost):
            return (10.0, 11.0, 12.0, 20.0)[client]

    config = RunConfig(dataset="digits", algorithm="fluid", clients=4, clients_per_round=4, rounds=5, seed=3)
    algorithm = FLuID(config, np.ones(4), np.array([10, 10, 10, 10]))
    algorithm.model_name = "digits"
    algorithm.clock = Clock()
    algorithm.client_cost = lambda round, client, width, cost: cost
    empty = {n: torch.zeros(s.shape) for n, s in build_model("digits").param_specs().items()}
    results = [ClientResult(c, 1.0, dict(empty), 10, 1.0, 1) for c in range(4)]
    algorithm.inspect_updates(0, {n: t + 1 for n, t in empty.items()}, results)
    assert algorithm.straggler_widths() == {}  # rnd 1: nobody yet
    algorithm.inspect_updates(1, {n: t + 1 for n, t in empty.items()}, results[:1])
    assert algorithm.straggler_widths() == {}  # one client: nothing to rank
    algorithm.inspect_updates(1, {n: t + 1 for n, t in empty.items()}, results)
    p = straggler_fraction(12.0, 20.0)
    assert p == 0.65 and algorithm.straggler_widths() == {3: 0.65}  # 12 / 20 = 0.6: the table gives 0.65
    assert algorithm.allocate(2, [0, 3]) == {0: 1.0, 3: p}


def test_a_straggler_that_replaces_another_starts_from_its_last_drops():
    """iwang05/FLuID @ 206246d03f2b, CIFAR10/fedDropCIFAR_android.py: drop_dynamic keeps one list of last drops per
    layer (prevDropWeights), whoever the straggler, and aggregate_fit's replacement of a straggler leaves it as it
    is, so the new straggler's first certain drops (find_stable's defDropWeights) are the last drops of the one it
    replaced that are still invariant: with every channel invariant and a larger p, a subset of them (but for the
    last conv, whose drops skip the certain ones)."""
    seconds = {0: 10.0, 1: 11.0, 2: 12.0, 3: 20.0}

    class Clock:
        def base_cost(self, client, width, depth=None):
            return client

        def seconds(self, client, cost):
            return seconds[client]

    config = RunConfig(dataset="digits", algorithm="fluid", clients=4, clients_per_round=4, rounds=6, seed=3)
    algorithm = FLuID(config, np.ones(4), np.array([10, 10, 10, 10]))
    algorithm.model_name, algorithm.clock = "digits", Clock()
    algorithm.client_cost = lambda round, client, width, cost: cost
    generator = torch.Generator().manual_seed(4)
    global_params = {n: torch.randn(s.shape, generator=generator) + 0.1 for n, s in
                     build_model("digits").param_specs().items()}
    unmoved = {n: torch.zeros(w.shape) for n, w in global_params.items()}  # every channel invariant at any threshold
    for t in range(3):
        widths = algorithm.allocate(t, [0, 1, 2, 3])
        if t == 2:
            assert widths[3] == 0.65  # chosen at rnd 2: 12 / 20 = 0.6
            sets = algorithm.channel_sets(t, 3, 0.65)
            first = [sorted(set(range(size)) - set(kept)) for size, kept in zip(SIZES, sets)]
            seconds[2] = 40.0  # slower than the straggler's full-model estimate, 20 / 0.65 x 1.15
        algorithm.inspect_updates(t, global_params, [ClientResult(c, widths[c], dict(unmoved), 10, 1.0, 1)
                                                     for c in range(4)])
    assert algorithm.straggler_widths() == {2: 0.85} and 3 not in algorithm.previous
    assert algorithm.allocate(3, [0, 1, 2, 3])[2] == 0.85
    second = [sorted(set(range(size)) - set(kept)) for size, kept in zip(SIZES, algorithm.channel_sets(3, 2, 0.85))]
    assert algorithm.layout().last_conv == 1  # whose drops skip the certain ones, in the source too
    for group in (0, 2):
        size = SIZES[group]
        assert len(second[group]) == size - math.ceil(0.85 * size) and set(second[group]) < set(first[group])
