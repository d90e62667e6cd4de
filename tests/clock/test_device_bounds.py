"""Device values whose simulated times would under- or overflow are refused with the bound (issue 37 item 6): a
subnormal speed, ``speed_sigma: 1000``, a Pareto shape that draws infinity, Markov means below a millisecond or
beyond 1e9 s, a trace's values and intervals out of range and a trace period that overflows the cycle, each one
sentence naming the value and the bound, exit 2, no run directory; and ``--algo-opt mu=5e-2`` read as the float a
config file reads. The clock's long loops (a Markov chain drawn far ahead, a scan of every client) stop on the first
signal (item 7)."""

import os
import signal

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.clock import Clock, DeviceProfiles, MarkovAvailability, WidthCosts, draw_profiles
from hasfl_ray.clock.availability import Availability
from hasfl_ray.clock.spec import DEVICE_BOUNDS, normalise_devices
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError, RoundInterrupted, RunInterrupted
from hasfl_ray.training.seeding import STREAM_DEVICES, numpy_rng

HEADER = "client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s,availability\n"

# (config file text, or a trace's rows after HEADER; words the sentence must contain)
YAML_CASES = [
    ("devices: {distribution: lognormal, speed_sigma: 1000}\n", ["speed_sigma 1000", "[1, 1e+21] MACs/s"]),
    ("devices: {distribution: lognormal, speed_median: 5.0e-324}\n", ["speed_median is 5e-324", "[1, 1e+21]"]),
    ("devices: {distribution: lognormal, down_sigma: 500}\n", ["down_sigma 500", "[1, 1e+21] bytes/s"]),
    ("devices: {distribution: lognormal, latency_sigma: 300}\n", ["latency_sigma 300", "[0, 1e+09] s"]),
    ("devices: {distribution: pareto, speed_shape: 1.0e-300}\n", ["speed_shape 1e-300", "[1, 1e+21] MACs/s"]),
    ("devices:\n  tiers: {0.25: {speed: 5.0e-324, down: 1, up: 1, latency: 0}, 1.0: {speed: 1, down: 1, up: 1, "
     "latency: 0}}\n", ["tiers speed is 5e-324", "[1, 1e+21] MACs/s"]),
    ("devices:\n  tiers: {1.0: {speed: 1.0e9, down: 1.0e6, up: 1.0e5, latency: 1.0e+30}}\n",
     ["tiers latency is 1e+30", "[0, 1e+09] s"]),
    ("devices: lognormal\navailability: markov:1e-300,1\n", ["markov:1e-300,1", "[0.001, 1e+09]"]),
    ("devices: lognormal\navailability: markov:3600,1e308\n", ["markov:3600,1e308", "[0.001, 1e+09]"]),
]
TRACE_CASES = [
    ("0,5e-324,1e6,1e5,0,\n", ["speed_macs_per_s '5e-324' on line 2", "[1, 1e+21] MACs/s"]),
    ("0,1e9,1e300,1e5,0,\n", ["down_bytes_per_s '1e300'", "[1, 1e+21] bytes/s"]),
    ("0,1e9,1e6,1e5,1e12,\n", ["latency_s '1e12'", "[0, 1e+09] s"]),
    ("0,1e9,1e6,1e5,0,0-1e308\n", ["interval '0-1e308'", "END <= 1e+09"]),
    ("0,1e9,1e6,1e5,0,0-1e-300\n", ["availability period of 1e-300 s", "at least 0.001 s"]),
]


def refused(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1", "--clients", "1",
                                       "--clients-per-round", "1", "--quiet", "--out", "run", *argv])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 200 and "Traceback" not in result.output, result.output
    assert not os.path.exists(tmp_path / "run")
    return lines[0]


@pytest.mark.parametrize("text, words", YAML_CASES)
def test_a_config_whose_device_times_overflow_is_refused_with_the_bound(tmp_path, monkeypatch, text, words):
    (tmp_path / "c.yaml").write_text(text)
    sentence = refused(tmp_path, monkeypatch, ["--config", "c.yaml"])
    assert all(word in sentence for word in words), sentence


@pytest.mark.parametrize("rows, words", TRACE_CASES)
def test_a_trace_whose_device_times_overflow_is_refused_with_the_bound(tmp_path, monkeypatch, rows, words):
    (tmp_path / "t.csv").write_text(HEADER + rows)
    sentence = refused(tmp_path, monkeypatch, ["--devices", "t.csv"])
    assert all(word in sentence for word in words), sentence


def test_every_drawn_value_is_within_its_bounds_and_the_defaults_are_unchanged():
    spec = normalise_devices("lognormal")
    profiles = draw_profiles(spec, 7, 200_000)
    for kind, values in zip(("speed", "down", "up", "latency"),
                            (profiles.speed, profiles.down, profiles.up, profiles.latency)):
        low, high, _ = DEVICE_BOUNDS[kind]
        assert low <= values.min() and values.max() <= high
    reference = numpy_rng(7, STREAM_DEVICES)  # the same draws as before the bounds: the device stream's values
    assert np.array_equal(profiles.speed, 2e9 * np.exp(0.8 * reference.standard_normal(200_000)))
    with pytest.raises(ConfigError, match=r"speed_sigma 40\b.*client"):
        draw_profiles({**spec, "speed_sigma": 40.0}, 7, 1000)


def test_algo_opt_reads_scientific_notation_as_a_float(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1", "--quiet", "--algorithm",
                                       "fedprox", "--algo-opt", "mu=5e-2", "--out", "run"])
    assert result.exit_code == 0, result.output
    assert "mu: 0.05\n" in (tmp_path / "run" / "config.yaml").read_text()


# -- the clock's long loops stop on the first signal ---------------------------------------------------------------

def test_a_markov_chain_drawn_far_ahead_is_linear_and_stops_when_asked():
    """A chain asked far ahead keeps only what a later answer needs while it is drawn (the same answers as a chain
    drawn whole), and asks the stop check as it goes: a stop requested ends it with RoundInterrupted."""
    chain = MarkovAvailability(0.01, 0.01, 5)
    far = chain.window(3, 5000.0)  # 500,000 changes: seconds at worst, never quadratic
    assert len(chain._chains[3][3]) <= 2 * MarkovAvailability.BLOCK + 1
    assert MarkovAvailability(0.01, 0.01, 5).window(3, 5000.0) == far
    asked = []
    stopping = MarkovAvailability(0.01, 0.01, 5)
    stopping.should_stop = lambda: asked.append(1) or True
    with pytest.raises(RoundInterrupted):
        stopping.window(3, 5000.0)
    assert asked == [1]


class NobodyYet(Availability):
    """Nobody available before time 100; everybody from then on (so a round waits, scanning every client)."""

    always = False

    def window(self, client, time):
        return (time >= 100, np.inf)

    def next_on(self, client, time):
        return max(time, 100.0)


def test_the_scan_of_every_client_stops_when_asked():
    n = 5000
    profiles = DeviceProfiles(*(np.full(n, v) for v in (1e9, 1e6, 1e5, 0.0)))
    clock = Clock(profiles, NobodyYet(), WidthCosts("digits"), np.full(n, 40), 10, 1, 0)
    assert clock.invite(0, 3).idle_s == 100.0  # no stop asked: the scan runs through and the server waits
    asked = []
    clock.stop_when(lambda: asked.append(1) or len(asked) > 2)
    with pytest.raises(RoundInterrupted):
        clock.invite(1, 3)
    assert len(asked) == 3 and clock.now == 0.0  # nothing of the clock changed


every_client = Clock._every_client


def test_a_signal_during_the_clocks_scan_stops_the_run_and_resume_finishes_it(tmp_path, monkeypatch):
    """SIGINT while the clock scans every client for an available one (a Markov population almost never on): the
    run stops at once with a checkpoint of the rounds before, and --resume ends as a run never interrupted."""
    keys = dict(backend="local", clients=8, clients_per_round=2, rounds=2, seed=4, devices="lognormal",
                availability="markov:5,100000", checkpoint_every=1)
    plain = Engine(RunConfig(**keys), out_dir=str(tmp_path / "plain")).run()
    sent = []
    window = MarkovAvailability.window

    def signalling(self, client, time):
        if engine.history and not sent:  # round 1 asks its candidates (all 8 off): its scan of every client follows
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        return window(self, client, time)

    out = str(tmp_path / "stopped")
    engine = Engine(RunConfig(**keys), out_dir=out)
    monkeypatch.setattr(MarkovAvailability, "window", signalling)
    scans = []
    monkeypatch.setattr(Clock, "_every_client", lambda self: scans.append(len(engine.history)) or every_client(self))
    with pytest.raises(RunInterrupted) as stopped:
        engine.run()
    monkeypatch.undo()
    assert sent and stopped.value.rounds_done == 1 and scans.count(1) == 1  # round 1's scan stopped at its first check
    resumed = Engine(RunConfig(**keys), out_dir=out, resume=True).run()
    assert resumed["params_sha256"] == plain["params_sha256"]
    assert resumed["sim_hours"] == plain["sim_hours"]
