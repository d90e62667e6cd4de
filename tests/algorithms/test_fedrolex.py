"""FedRolex: window positions, windowed extraction and aggregation, and where a round's updates land."""

import numpy as np
import pytest
import torch

from algorithm_runs import P_MAX_4, SAMPLES_4, mask_fraction, small_config
from hasfl_ray.aggregation import aggregate_updates
from hasfl_ray.aggregation.windows import _aggregate_mixed, aggregate_windows
from hasfl_ray.algorithms.fedrolex import FedRolex
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.engine import sample_participants
from hasfl_ray.models import build_model, extract, mask
from hasfl_ray.models.slicing import (DimSlice, ParamSpec, extract_window, gate_blocks_of, roll_channels,
                                      window_index, window_linear_index)


def test_window_positions_hand_checked():
    assert window_index(DimSlice(5), 3, 0).tolist() == [0, 1, 2]  # offset 0: the leading slice
    assert window_index(DimSlice(5), 3, 3).tolist() == [3, 4, 0]  # wraps around
    assert window_index(DimSlice(5), 3, 13).tolist() == [3, 4, 0]  # offsets act modulo the channel count
    assert window_index(DimSlice(10, unit=2), 2, 4).tolist() == [8, 9, 0, 1]  # channel 4 = positions 8, 9
    assert window_index(DimSlice(10, blocks=2), 2, 4).tolist() == [4, 0, 9, 5]  # inside each gate block
    assert window_index(DimSlice(7, scaled=False), 3, 4).tolist() == list(range(7))


def test_algorithm_rolls_one_step_per_round_for_every_client(config4):
    algorithm = FedRolex(small_config(algorithm="fedrolex"), P_MAX_4, SAMPLES_4)
    algorithm.model_name = "digits"  # as the engine sets it: 32, 64 and 128 channels
    assert [algorithm.window_offset(t, 2) for t in range(4)] == [0, 127, 126, 125]  # FedRolex's code: -t mod C
    assert algorithm.window_offset(5, 0) == algorithm.window_offset(5, 3) == 123
    assert algorithm.allocate(0, [0, 3]) == {0: 0.25, 3: 1.0}  # widths are HeteroFL's
    forward = FedRolex(small_config(algorithm="fedrolex", rolex_direction="forward"), P_MAX_4, SAMPLES_4)
    assert [forward.window_offset(t, 2) for t in range(4)] == [0, 1, 2, 3]  # the former +t window, no model needed
    assert FedRolex(small_config(algorithm="fedrolex", rolex_step=3, rolex_direction="forward"), P_MAX_4,
                    SAMPLES_4).window_offset(4, 1) == 12


def test_extracted_window_is_the_rolled_leading_slice():
    spec = ParamSpec("w", (DimSlice(6), DimSlice(8, unit=2), DimSlice(3, scaled=False)))
    full = torch.arange(6 * 8 * 3, dtype=torch.float32).reshape(6, 8, 3)
    window = extract_window(full, spec, 0.5, 5)  # 3 of 6 rows from row 5; 2 of 4 channels (x2) from channel 1
    expected = full[[5, 0, 1]][:, [2, 3, 4, 5]]
    assert torch.equal(window, expected)
    assert torch.equal(extract(roll_channels(full, spec, -5), spec, 0.5), window)
    assert torch.equal(full.flatten()[window_linear_index(spec, window.shape, 5)], window)


@pytest.mark.parametrize("model_name", ["digits", "shakespeare"])
def test_aggregate_windows_shared_offset_equals_the_scatter_reference(model_name):
    specs = build_model(model_name).param_specs()
    generator = torch.Generator().manual_seed(0)
    widths, weights = [0.25, 0.5, 1.0, 0.75], [3.0, 1.0, 2.0, 5.0]
    for offsets in ([0, 0, 0, 0], [5, 5, 5, 5], [0, 3, 9, 5]):
        updates = [{name: extract_window(torch.randn(spec.shape, generator=generator), spec, p, o)
                    for name, spec in specs.items()} for p, o in zip(widths, offsets)]
        result = aggregate_windows(specs, updates, offsets, weights, backend="reference")
        oracle = _aggregate_mixed(specs, updates, offsets, torch.tensor(weights, dtype=torch.float64))
        for name in specs:
            torch.testing.assert_close(result.delta[name], oracle.delta[name])
        torch.testing.assert_close(result.div_num, oracle.div_num)
        torch.testing.assert_close(result.div_den, oracle.div_den)
        assert result.covered_fraction == oracle.covered_fraction
        if offsets == [0, 0, 0, 0]:  # and offset 0 is exactly the leading-slice aggregation
            leading = aggregate_updates({n: s.shape for n, s in specs.items()}, updates, weights,
                                        gate_blocks_of(specs), backend="reference")
            for name in specs:
                torch.testing.assert_close(result.delta[name], leading.delta[name])


def test_mixed_offsets_mean_by_hand():
    spec = {"b": ParamSpec("b", (DimSlice(4),))}
    updates = [{"b": torch.tensor([1.0, 2.0])}, {"b": torch.tensor([10.0, 20.0])}]  # windows {3, 0} and {1, 2}
    result = aggregate_windows(spec, updates, [3, 1], [1.0, 3.0])
    torch.testing.assert_close(result.delta["b"], torch.tensor([2.0, 10.0, 20.0, 1.0]))
    torch.testing.assert_close(result.div_num, torch.zeros(2, dtype=torch.float64))
    shared = aggregate_windows(spec, updates, [3, 3], [1.0, 3.0])  # both on {3, 0}
    torch.testing.assert_close(shared.delta["b"], torch.tensor([(2 + 60) / 4, 0.0, 0.0, (1 + 30) / 4]))
    with pytest.raises(ValueError, match="one window offset per client"):
        aggregate_windows(spec, updates, [0], [1.0, 1.0])


def test_a_round_changes_exactly_the_participants_windows():
    engine = Engine(RunConfig.from_dict(dict(backend="local", algorithm="fedrolex", rounds=2, rolex_step=5, seed=4)))
    engine.prepare()
    engine.backend.start(engine.config, engine.dataset, engine.model_name, engine.initial_params)
    specs = build_model("digits").param_specs()
    for t in range(2):  # the leading slice, then the window at offset -5 (FedRolex's direction)
        before = engine.backend.get_params()
        engine.run_round(t)
        after = engine.backend.get_params()
        participants = sample_participants(engine.config.seed, t, 20, 10)
        widest = max(engine.p_max[i] for i in participants)
        for name, spec in specs.items():
            window = roll_channels(mask(spec, widest), spec, -5 * t)  # the widest window, rolled to offset -5t
            changed = before[name] != after[name]
            assert not (changed & ~window).any(), name  # nothing outside the round's windows moves
            assert changed[window].float().mean() > 0.99, name


class CappedRolex(FedRolex):
    """FedRolex's rolling windows with Uniform's widths min(0.5, p_max): no client ever trains a full layer."""

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.p_current = np.minimum(0.5, self.p_max)


def test_rolling_windows_reach_what_static_capped_widths_would_freeze():
    # step 48 on the digits CNN (32/64/128 channels): half-width windows visit every channel within 3 rounds;
    # a weight coordinate needs its row and its column in one round's windows, so that takes longer
    engine = Engine(RunConfig.from_dict(dict(backend="local", algorithm="fedrolex", rounds=4, rolex_step=48, seed=2)))
    engine.prepare()
    engine.algorithm = CappedRolex(engine.config, engine.p_max, engine.num_samples)
    engine.algorithm.model_name = engine.model_name  # what the engine gives the algorithm it builds
    engine.run()
    frozen = [line["frozen_fraction"] for line in engine.history]
    assert all(line["avg_p"] <= 0.5 for line in engine.history)
    assert frozen[0] >= 1 - mask_fraction(0.5) - 1e-9  # round 0: the leading half at most, as Uniform
    assert all(b < a for a, b in zip(frozen, frozen[1:]))
    assert frozen[-1] < 0.2 * (1 - mask_fraction(0.5))  # Uniform's widths leave 1 - mask_fraction(0.5) frozen
