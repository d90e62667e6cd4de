"""FedScale's device traces (issue 47 item 3): its client_device_capacity and client_behave_trace pickles read by
``--devices fedscale:PATH`` / ``--availability fedscale:PATH`` and mapped onto the width-aware clock.

The formats, as SymbioticLab/FedScale reads them (docs/clock.md, "FedScale's traces"):
fedscale/cloud/internal/client_metadata.py: ``speed['computation']`` is ms a sample (a training sample 3x that,
``augmentation_factor=3.0``), ``speed['communication']`` kbit/s, the transfer ``(upload + download) / bandwidth``;
``is_active``: ``active[j] <= t % finish_time <= inactive[j]``. fedscale/cloud/client_manager.py: client id c takes
``user_trace[user_trace_keys[c % len(user_trace)]]``. The two files in tests/clock/data are written in these formats.
"""

import os
import pickle

import numpy as np
import pytest

from hasfl_ray.clock.cost import TRAIN_FACTOR, WidthCosts, base_cost, seconds
from hasfl_ray.clock.fedscale import read_behave, read_capacity
from hasfl_ray.errors import DataError

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CAPACITY = os.path.join(HERE, "fedscale_device_capacity.pkl")
BEHAVE = os.path.join(HERE, "fedscale_behave_trace.pkl")


def fedscale_is_active(trace, t):
    """FedScale's ClientMetadata.is_active rule, for a trace asked at one time (fresh behavior_index: the scan)."""
    norm = t % trace["finish_time"]
    return any(a <= norm <= b for a, b in zip(trace["active"], trace["inactive"]))


def test_the_test_files_are_in_fedscales_format():
    capacity = pickle.load(open(CAPACITY, "rb"))
    behave = pickle.load(open(BEHAVE, "rb"))
    assert all(set(entry) == {"computation", "communication"} for entry in capacity.values())
    assert all(set(entry) == {"duration", "inactive", "finish_time", "active"} for entry in behave.values())


def test_capacity_maps_onto_the_clock_so_a_full_width_sample_takes_fedscales_time():
    capacity = pickle.load(open(CAPACITY, "rb"))
    keys = list(capacity)
    costs = WidthCosts("digits")
    profiles = read_capacity(CAPACITY, 6, costs.macs(1.0))
    for client in range(6):
        entry = capacity[keys[(client + 1) % len(keys)]]  # FedScale's client id client + 1, its key-order rule
        # the clock's full-width sample: TRAIN_FACTOR x MACs / speed == FedScale's 3 x computation ms
        assert TRAIN_FACTOR * costs.macs(1.0) / profiles.speed[client] == pytest.approx(
            3 * entry["computation"] / 1000, rel=1e-12)
        # bytes / bandwidth == kbits / kbps both ways
        assert profiles.down[client] == profiles.up[client] == entry["communication"] * 1000 / 8
        assert profiles.latency[client] == 0
    # a narrower width trains faster on the same device (the width-aware cost), the transfer shrinks with it
    full, quarter = (seconds(base_cost(costs, w, 64, 32, 1), profiles.speed[0], profiles.down[0], profiles.up[0], 0)
                     for w in (1.0, 0.25))
    assert quarter < full


def test_availability_is_fedscales_rule_per_client_with_its_own_period():
    behave = pickle.load(open(BEHAVE, "rb"))
    keys = list(behave)
    availability = read_behave(BEHAVE, 5)
    for client in range(5):
        trace = behave[keys[(client + 1) % len(keys)]]
        # away from the interval ends (FedScale's are closed, the clock's half-open), over several cycles
        bounds = set(trace["active"]) | set(trace["inactive"])
        for t in np.arange(0.5, 4 * trace["finish_time"], 7.25):
            if t % trace["finish_time"] in bounds:
                continue
            assert availability.window(client, float(t))[0] == fedscale_is_active(trace, t), (client, t)
        on = availability.next_on(client, 0.0 if fedscale_is_active(trace, 0.0) else 1.0)
        assert availability.window(client, on)[0]
    # per-client periods: client 0 takes id 2 (finish_time 600), client 1 id 3 (1500)
    assert availability.periods[:2].tolist() == [600.0, 1500.0]
    assert availability.longest_on()[:2].tolist() == [300.0, 500.0]  # 100-400; 700-1200


def test_a_pickled_object_is_refused_unexecuted(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({1: {"computation": Payload(), "communication": 10.0}}))
    with pytest.raises(DataError, match="refused, not executed") as caught:
        read_capacity(str(path), 2, 1000)
    assert not marker.exists() and "\n" not in str(caught.value)


@pytest.mark.parametrize("table, words", [
    ({1: {"computation": 10.0}}, "no 'communication' for client 1"),
    ({1: {"computation": -3.0, "communication": 10.0}}, "computation -3.0 for client 1"),
    ({1: {"computation": 5.0, "communication": 0}}, "communication 0 for client 1"),
    ({1: {"computation": "fast", "communication": 10.0}}, "computation 'fast'"),
    ({}, "holds dict (empty)"),
    ([1, 2], "holds list"),
])
def test_bad_capacity_traces_are_one_sentence(tmp_path, table, words):
    path = tmp_path / "cap.pkl"
    path.write_bytes(pickle.dumps(table))
    with pytest.raises(DataError, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        read_capacity(str(path), 3, 1000)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("entry, words", [
    ({"active": [0], "inactive": [10]}, "no 'finish_time'"),
    ({"active": [0, 5], "inactive": [10], "finish_time": 20}, "two lists of seconds of one length"),
    ({"active": [5, 0], "inactive": [8, 3], "finish_time": 20}, "ascending intervals"),
    ({"active": [0], "inactive": [30], "finish_time": 20}, "ascending intervals"),
    ({"active": [0], "inactive": [10], "finish_time": -1}, "finish_time -1"),
    ({"active": [4], "inactive": [4], "finish_time": 20}, "no interval of positive length"),
])
def test_bad_availability_traces_are_one_sentence(tmp_path, entry, words):
    path = tmp_path / "behave.pkl"
    path.write_bytes(pickle.dumps({7: dict(entry, duration=1)}))
    with pytest.raises(DataError, match=words) as caught:
        read_behave(str(path), 2)
    assert "\n" not in str(caught.value)


def test_a_file_that_is_not_a_pickle(tmp_path):
    path = tmp_path / "cap"
    path.write_bytes(b"client,computation\n1,2\n")
    with pytest.raises(DataError, match="not a readable pickle"):
        read_capacity(str(path), 2, 1000)


def test_the_config_forms_of_fedscale_traces():
    from hasfl_ray.clock.spec import normalise_availability, normalise_devices
    from hasfl_ray.errors import ConfigError

    assert normalise_devices("fedscale: traces/cap") == {"fedscale": "traces/cap"}
    assert normalise_devices({"fedscale": "traces/cap"}) == {"fedscale": "traces/cap"}
    assert normalise_availability(" fedscale:traces/behave") == "fedscale:traces/behave"
    for bad in ({"fedscale": "x", "tiers": []}, {"fedscale": ""}, "fedscale:"):
        with pytest.raises(ConfigError, match="devices is"):
            normalise_devices(bad)
