"""The device clock's pieces without the engine (docs/clock.md): profiles from each source, availability, the cost
of a width, a round's verdict under each deadline policy computed by hand, and sampling that checks O(K) clients."""

import math
import os
import time

import numpy as np
import pytest
import torch

from hasfl_ray.clock import (Clock, Invitation, MarkovAvailability, TraceAvailability, WidthCosts, base_cost, draw_profiles,
                             local_batches, read_trace, seconds, tier_profiles)
from hasfl_ray.clock.availability import Availability
from hasfl_ray.clock.clock import INF
from hasfl_ray.clock.profiles import DeviceProfiles
from hasfl_ray.clock.spec import normalise_devices
from hasfl_ray.errors import ConfigError, DataError
from hasfl_ray.models import cost_table
from hasfl_ray.training.workspace import client_batches

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
SAMPLE = os.path.join(REPO, "configs", "devices", "sample-trace.csv")


# -- profiles ---------------------------------------------------------------------------------------------------------

def test_seeded_profiles_are_the_seeds_own_and_cheap_at_a_million_clients():
    spec = normalise_devices("lognormal")
    a, b, c = draw_profiles(spec, 42, 1000), draw_profiles(spec, 42, 1000), draw_profiles(spec, 43, 1000)
    for name in ("speed", "down", "up", "latency"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert not np.array_equal(getattr(a, name), getattr(c, name))
    assert np.median(a.down) == pytest.approx(spec["down_median"], rel=0.15)
    pareto = draw_profiles(normalise_devices("pareto"), 42, 1000)
    assert pareto.speed.min() >= 1e9  # the Pareto minimum x_m
    start = time.perf_counter()
    big = draw_profiles(spec, 0, 1_000_000)
    assert time.perf_counter() - start < 2.0
    assert sum(getattr(big, n).nbytes for n in ("speed", "down", "up", "latency")) <= 100e6


def test_the_sample_trace_loads_with_its_intervals():
    profiles = read_trace(SAMPLE, 20)
    assert profiles.row(0) == {"speed_macs_per_s": 5e7, "down_bytes_per_s": 2.5e5, "up_bytes_per_s": 6.25e4,
                               "latency_s": 0.15}
    offsets, starts, ends, period = profiles.intervals
    assert period == 5400.0
    assert (starts[offsets[1]:offsets[2]].tolist(), ends[offsets[1]:offsets[2]].tolist()) == \
        ([0.0, 3600.0], [1800.0, 5400.0])
    assert offsets[1] == offsets[0]  # client 0: none, always available


def test_a_trace_without_ids_is_a_pool_dealt_in_order_and_names_match_clients(tmp_path):
    pool = tmp_path / "pool.csv"
    pool.write_text("speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\n1e9,1e6,1e5,0.1\n2e9,2e6,2e5,0\n")
    assert read_trace(str(pool), 5).speed.tolist() == [1e9, 2e9, 1e9, 2e9, 1e9]
    named = tmp_path / "named.csv"
    named.write_text("name,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\nb,2,2,2,2\na,1,1,1,1\n")
    assert read_trace(str(named), 2, ["a", "b"]).speed.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("text, phrase", [
    ("speed_macs_per_s,down_bytes_per_s,up_bytes_per_s\n1,1,1\n", "has no column 'latency_s'"),
    ("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\n0,fast,1,1,1\n",
     "has speed_macs_per_s 'fast' on line 2"),
    ("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\n0,1,1,1\n", "has 4 fields on line 2"),
    ("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\n0,1,1,1,-1\n", "has latency_s '-1'"),
    ("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\n0,1,1,1,1\n0,1,1,1,1\n", "client '0' twice"),
    ("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\n0,1,1,1,1\n", "no row for client '1'"),
    ("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s,availability\n0,1,1,1,1,5-2\n1,1,1,1,1,\n",
     "availability interval '5-2'"),
    ("speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s,colour\n1,1,1,1,red\n", "unknown column 'colour'"),
    ("", "is empty"),
])
def test_a_malformed_trace_is_one_sentence(tmp_path, text, phrase):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(DataError) as error:
        read_trace(str(path), 2)
    assert phrase in str(error.value) and "\n" not in str(error.value)


def test_per_tier_devices_follow_p_max_and_a_missing_tier_is_refused():
    spec = normalise_devices({"tiers": {0.5: dict(speed=1e9, down=1e6, up=1e5, latency=0.1),
                                        1.0: dict(speed=4e9, down=4e6, up=4e5, latency=0.05)}})
    profiles = tier_profiles(spec["tiers"], np.array([1.0, 0.5, 0.5]))
    assert profiles.speed.tolist() == [4e9, 1e9, 1e9] and profiles.latency.tolist() == [0.05, 0.1, 0.1]
    with pytest.raises(ConfigError, match="no device for width 0.25"):
        tier_profiles(spec["tiers"], np.array([0.25, 1.0]))


# -- the cost of a width ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("samples, batch, epochs", [(1, 32, 3), (2, 32, 1), (33, 32, 2), (64, 32, 2), (70, 10, 1),
                                                    (71, 10, 2), (0, 8, 1)])
def test_local_batches_are_the_trainers_steps(samples, batch, epochs):
    real = [int(p.numel()) for p in client_batches(torch.Generator().manual_seed(0), samples, batch, epochs)]
    assert local_batches(samples, batch, epochs).tolist() == real


def test_a_partial_clients_batches_are_the_first_of_its_full_sequence():
    full = [p.tolist() for p in client_batches(torch.Generator().manual_seed(5), 70, 16, 2)]
    cut = [p.tolist() for p in client_batches(torch.Generator().manual_seed(5), 70, 16, 2, max_steps=6)]
    assert cut == full[:6] and len(full) == 10


def test_the_cost_of_a_width_is_the_cost_tables():
    costs = WidthCosts("digits")
    for row in cost_table("digits"):
        assert costs.params(row["p"]) == row["params"] and costs.macs(row["p"]) == row["macs"]
        cost = base_cost(costs, row["p"], 70, 32, 2)
        assert cost.bytes_down == cost.bytes_up == 4 * row["params"]
        assert cost.step_macs.tolist() == [3 * row["macs"] * b for b in (32, 32, 6, 32, 32, 6)]
    one = base_cost(costs, 0.5, 70, 32, 2)
    assert seconds(one, 2e9, 1e6, 1e5, 0.25) == \
        4 * costs.params(0.5) / 1e6 + 3 * costs.macs(0.5) * 140 / 2e9 + 4 * costs.params(0.5) / 1e5 + 0.25


def test_the_cost_table_keeps_a_bounded_number_of_widths_and_gives_the_same_costs(monkeypatch):
    """Issue 46 item 4: continuous widths (a new width every client) keep at most WIDTH_COSTS_KEPT entries, the least
    recently used out, and a width asked again after its entry went gives the same costs."""
    import hasfl_ray.clock.cost as cost_module

    monkeypatch.setattr(cost_module, "WIDTH_COSTS_KEPT", 4)
    costs, fresh = WidthCosts("digits"), WidthCosts("digits")
    widths = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.3]
    for width in widths:
        assert (costs.params(width), costs.macs(width)) == (fresh.params(width), fresh.macs(width))
        assert len(costs._cache) <= 4
    assert list(costs._cache) == [0.45, 0.5, 0.55, 0.3]  # 0.3 came back after it went; the least recent first
    costs.macs(0.45)  # a use moves it to the end
    assert list(costs._cache)[-1] == 0.45


# -- availability -----------------------------------------------------------------------------------------------------

def test_markov_availability_does_not_depend_on_what_else_was_asked():
    times = [0.0, 10.0, 500.0, 5000.0, 60000.0]
    forward, backward = MarkovAvailability(600, 300, 7), MarkovAvailability(600, 300, 7)
    ahead = [forward.window(c, t) for c in range(30) for t in times]
    MarkovAvailability(600, 300, 7).window(3, 1e6)
    behind = {(c, t): backward.window(c, t) for c in reversed(range(30)) for t in reversed(times)}
    assert ahead == [behind[(c, t)] for c in range(30) for t in times]
    on = np.mean([forward.window(c, 5000.0)[0] for c in range(30)] +
                 [MarkovAvailability(600, 300, 8).window(c, 9000.0)[0] for c in range(300)])
    assert 0.55 < on < 0.8  # stationary share 600 / 900
    for c in range(30):
        available, until = forward.window(c, 100.0)
        nxt = forward.next_on(c, 100.0)
        assert (nxt == 100.0) == available and forward.window(c, nxt)[0]
        if available:
            assert until > 100.0 and not forward.window(c, until)[0]


def test_trace_availability_repeats_with_the_traces_period():
    avail = TraceAvailability(*read_trace(SAMPLE, 20).intervals)
    assert avail.window(0, 123.0) == (True, INF)
    assert avail.window(1, 100.0) == (True, 1800.0)
    assert avail.window(1, 2000.0)[0] is False and avail.next_on(1, 2000.0) == 3600.0
    assert avail.window(1, 5400.0 + 100.0) == (True, 5400.0 + 1800.0)  # the next period
    assert avail.window(3, 100.0)[0] is False and avail.next_on(3, 100.0) == 600.0
    assert avail.next_on(3, 4000.0) == 5400.0 + 600.0


class Counting(MarkovAvailability):
    def __init__(self, *args):
        super().__init__(*args)
        self.asked = set()

    def window(self, client, time):
        self.asked.add(client)
        return super().window(client, time)


def clock_of(profiles, availability=None, **kwargs):
    n = len(profiles)
    return Clock(profiles, availability or Availability(), WidthCosts("digits"), np.full(n, 40), 10, 1, 3, **kwargs)


def flat_profiles(n, speed=1e9, down=1e6, up=1e5, latency=0.0):
    return DeviceProfiles(*(np.full(n, v, dtype=np.float64) for v in (speed, down, up, latency)))


def test_sampling_a_million_clients_asks_about_o_k_of_them():
    availability = Counting(600, 600, 1)
    clock = clock_of(flat_profiles(1_000_000), availability)
    start = time.perf_counter()
    invitation = clock.invite(0, 50)
    assert time.perf_counter() - start < 1.0
    assert len(invitation.clients) == 50 and invitation.clients == sorted(invitation.clients)
    assert all(availability.window(c, 0.0)[0] for c in invitation.clients)
    assert len(availability.asked) == 50 + invitation.unavailable <= 400
    assert clock.invite(0, 50) == invitation  # seeded by round


def test_fewer_available_than_k_invites_every_available_client_and_none_waits(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s,availability\n"
                     "0,1e9,1e6,1e5,0,100-200\n1,1e9,1e6,1e5,0,150-300\n2,1e9,1e6,1e5,0,0-50\n")
    profiles = read_trace(str(trace), 3)
    clock = clock_of(profiles, TraceAvailability(*profiles.intervals))
    assert clock.invite(0, 2).clients == [2]  # only client 2 is on at 0
    clock.now = 60.0
    invitation = clock.invite(1, 2)  # nobody is on at 60: the server waits until 100
    assert (invitation.clients, invitation.idle_s) == ([0], 40.0)


# -- a round's verdict, by hand ---------------------------------------------------------------------------------------

def hand_seconds(clock, client, width, steps=None):
    costs = clock.costs
    macs = 3 * costs.macs(width) * 10 * (4 if steps is None else steps)  # 40 samples, batches of 10, one epoch
    p = clock.profiles
    return (4 * costs.params(width) / p.down[client] + macs / p.speed[client] + 4 * costs.params(width) / p.up[client]
            + p.latency[client])


def mixed_clock(**kwargs):
    profiles = DeviceProfiles(np.array([4e8, 1e8, 2e7, 5e7, 3e8]), np.array([1e6, 5e5, 2e5, 1e6, 4e5]),
                              np.array([2e5, 1e5, 5e4, 1e5, 1e5]), np.array([0.1, 0.2, 0.05, 0.0, 0.3]))
    return clock_of(profiles, **kwargs)


def settle(clock, widths, per_round):
    invited = sorted(widths)
    costs = {c: clock.base_cost(c, w) for c, w in widths.items()}
    return clock.settle(0, invited, costs, per_round)


WIDTHS = {0: 1.0, 1: 0.5, 2: 0.25, 3: 1.0, 4: 0.75}


def test_without_a_deadline_the_round_is_its_slowest_client():
    clock = mixed_clock()
    outcome = settle(clock, WIDTHS, 5)
    times = {c: hand_seconds(clock, c, w) for c, w in WIDTHS.items()}
    assert outcome.kept == [0, 1, 2, 3, 4] and outcome.arrivals == times
    assert outcome.round_time == max(times.values())
    assert outcome.bytes_down == outcome.bytes_up == sum(4 * clock.costs.params(w) for w in WIDTHS.values())


def test_drop_partial_and_overselect_by_hand():
    times = {c: hand_seconds(mixed_clock(), c, w) for c, w in WIDTHS.items()}
    deadline = sorted(times.values())[2] + 1e-9  # the three fastest make it
    fast = sorted(sorted(times, key=times.get)[:3])
    outcome = settle(mixed_clock(deadline=deadline), WIDTHS, 5)
    assert (outcome.kept, outcome.late, outcome.round_time) == (fast, sorted(set(WIDTHS) - set(fast)), deadline)
    assert outcome.bytes_up == sum(4 * mixed_clock().costs.params(WIDTHS[c]) for c in fast)

    slowest = max(times, key=times.get)
    partial = hand_seconds(mixed_clock(), slowest, WIDTHS[slowest], 2) + 1e-9  # the slowest does 2 of its 4 steps
    clock = mixed_clock(deadline=partial, policy="partial")
    outcome = settle(clock, WIDTHS, 5)
    expected_steps, on_time = {}, []
    for c in WIDTHS:
        if times[c] <= partial:
            on_time.append(c)
            continue
        fit = max((k for k in range(5) if hand_seconds(clock, c, WIDTHS[c], k) <= partial), default=0)
        if fit:
            expected_steps[c] = fit
    assert outcome.steps == expected_steps and expected_steps[slowest] == 2
    assert outcome.kept == sorted(on_time + list(expected_steps))
    assert outcome.late == sorted(set(WIDTHS) - set(outcome.kept))
    for c, k in expected_steps.items():
        assert outcome.arrivals[c] == hand_seconds(clock, c, WIDTHS[c], k) <= partial

    clock = mixed_clock(policy="overselect", overselect=0.5)
    assert clock.invitations(3) == 5  # ceil(1.5 x 3) invited, the first 3 kept
    outcome = settle(clock, WIDTHS, 3)
    assert outcome.kept == fast and outcome.round_time == sorted(times.values())[2]
    assert outcome.late == sorted(set(WIDTHS) - set(fast))


def test_dropout_draws_from_the_clocks_own_stream():
    clock = mixed_clock(dropout=0.5)
    outcome = settle(clock, WIDTHS, 5)
    from hasfl_ray.training.seeding import STREAM_CLOCK, numpy_rng
    draws = numpy_rng(3, STREAM_CLOCK, 0, 1).random((5, 2))
    dropped = [c for k, c in enumerate(sorted(WIDTHS)) if draws[k, 0] < 0.5]
    assert outcome.dropped == dropped and outcome.kept == sorted(set(WIDTHS) - set(dropped))
    stops = {c: draws[k, 1] * hand_seconds(clock, c, WIDTHS[c]) for k, c in enumerate(sorted(WIDTHS)) if c in dropped}
    assert all(outcome.stops[c] == stops[c] for c in dropped)
    assert outcome.round_time == max(outcome.stops.values())
    clock.advance(Invitation(sorted(WIDTHS)), outcome, sorted(WIDTHS))
    assert clock.now == outcome.round_time
    shares = clock.wait_shares()
    for c in outcome.kept:
        assert shares[c] == pytest.approx((outcome.round_time - outcome.arrivals[c]) / outcome.round_time)
    assert all(shares[c] == 0.0 for c in dropped)  # working until they dropped, never waiting


def test_markov_availability_keeps_bounded_memory_and_the_same_answers(monkeypatch):
    """A chain keeps only its change times from just before the last time asked, and at most MAX_CHAINS chains are
    kept: the answers are those of a chain that keeps everything, in any order of asking (a time before what a
    chain kept, or a dropped chain, is drawn again from its own stream)."""
    class KeepsAll(MarkovAvailability):
        BLOCK, MAX_CHAINS = 8, 10 ** 9

        def _state(self, client, time):  # the chain drawn from its stream every time: the reference
            self._chains.clear()
            return super()._state(client, time)

    monkeypatch.setattr(MarkovAvailability, "BLOCK", 8)
    monkeypatch.setattr(MarkovAvailability, "MAX_CHAINS", 5)
    bounded, reference = MarkovAvailability(60, 30, 3), KeepsAll(60, 30, 3)
    rng = np.random.default_rng(0)
    forward = [(int(c), float(t)) for t in np.linspace(0, 20000, 60) for c in rng.integers(0, 12, 4)]
    shuffled = [forward[k] for k in rng.permutation(len(forward))]
    for client, t in forward + shuffled:
        assert bounded.window(client, t) == reference.window(client, t)
        assert bounded.next_on(client, t) == reference.next_on(client, t)
        assert len(bounded._chains) <= 5
        assert all(len(chain[3]) <= 3 * 8 for chain in bounded._chains.values())


def test_touching_availability_intervals_are_one_interval(tmp_path):
    """``0-0.05 0.05-100`` is ``0-100`` (issue 37 item 6): a client on across the joint is on there (read as two
    intervals, a round spanning 0.05 s found the client off and every update was dropped)."""
    head = "client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s,availability\n"
    joined, split = tmp_path / "joined.csv", tmp_path / "split.csv"
    joined.write_text(head + "0,1,1,1,1,0-100\n1,1,1,1,1,0-10 20-100\n")
    split.write_text(head + "0,1,1,1,1,0-0.05 0.05-100\n1,1,1,1,1,0-5 5-10 20-60 60-100\n")
    a, b = read_trace(str(joined), 2).intervals, read_trace(str(split), 2).intervals
    assert all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3])) and a[3] == b[3]
