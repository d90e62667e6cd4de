"""Clocked runs (docs/clock.md): off by default (nothing recorded, nothing changed), exact when on (round times,
bytes and late updates computed by hand from the cost table and the profiles), the deadline policies reaching the
trainer, a resume that continues the clock, the example deadline plug-in, and bad input in one sentence."""

import csv
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.engine import sample_participants
from hasfl_ray.engine.rundir import CLIENT_COLUMNS
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import cost_table

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
SAMPLE = os.path.join(REPO, "configs", "devices", "sample-trace.csv")
PLUGIN = os.path.join(REPO, "examples", "deadline_policy.py") + ":DeadlinePolicy"

TINY = dict(backend="local", clients=6, clients_per_round=3, rounds=3, local_epochs=1, seed=3, checkpoint_every=0,
            algorithm="heterofl")
TIERS = {"tiers": [dict(width=0.25, speed=2e7, down=2e5, up=5e4, latency=0.3),
                   dict(width=0.5, speed=5e7, down=5e5, up=1e5, latency=0.2),
                   dict(width=0.75, speed=1e8, down=1e6, up=2e5, latency=0.1),
                   dict(width=1.0, speed=3e8, down=4e6, up=1e6, latency=0.05)]}
CLOCK_KEYS = {"sim_time_s", "round_time_s", "idle_s", "bytes_down", "bytes_up", "invited", "late_updates",
              "dropped_updates", "partial_updates", "unavailable_clients", "participants_by_tier"}


def lines_of(out):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def run(tmp_path, name, **keys):
    out = str(tmp_path / name)
    engine = Engine(RunConfig(**{**TINY, **keys}), out_dir=out)
    summary = engine.run()
    return engine, summary, lines_of(out), out


def hand_seconds(engine, client, width, steps=None):
    """A client's seconds, from the cost table and its tier's device (docs/clock.md's formula)."""
    row = next(r for r in cost_table("digits", widths=(width,)))
    device = next(t for t in TIERS["tiers"] if t["width"] == engine.p_max[client])
    c = engine.config
    n = int(engine.num_samples[client])
    full, rest = divmod(n, c.batch_size)
    batches = ([c.batch_size] * full + ([rest] if rest >= 2 else [])) * c.local_epochs
    macs = 3 * row["macs"] * sum(batches[:steps])
    size = 4 * row["params"]
    return size / device["down"] + macs / device["speed"] + size / device["up"] + device["latency"]


def test_without_devices_nothing_is_recorded_and_with_them_training_is_unchanged(tmp_path):
    plain, plain_summary, plain_lines, plain_out = run(tmp_path, "plain")
    assert plain.clock is None
    assert not CLOCK_KEYS & set(plain_lines[0]) and "sim_hours" not in plain_summary
    with open(os.path.join(plain_out, "clients.csv"), encoding="utf-8") as handle:
        assert tuple(next(csv.reader(handle))) == CLIENT_COLUMNS
    clocked, summary, lines, out = run(tmp_path, "clocked", devices=TIERS)
    assert summary["params_sha256"] == plain_summary["params_sha256"]  # the clock only watches
    assert [line["test_accuracy"] for line in lines] == [line["test_accuracy"] for line in plain_lines]
    now = 0.0
    for t, line in enumerate(lines):
        participants = sample_participants(3, t, 6, 3)
        times = [hand_seconds(clocked, i, clocked.p_max[i]) for i in participants]
        assert line["round_time_s"] == max(times)
        now += max(times)
        assert line["sim_time_s"] == now
        size = sum(4 * cost_table("digits", widths=(clocked.p_max[i],))[0]["params"] for i in participants)
        assert line["bytes_down"] == line["bytes_up"] == size
        assert (line["invited"], line["late_updates"], line["dropped_updates"]) == (3, 0, 0)
        assert sum(line["participants_by_tier"].values()) == 3
    assert summary["sim_hours"] == now / 3600
    assert summary["sim_gb"] == sum(2 * line["bytes_up"] for line in lines) / 1e9
    assert set(summary["time_to_accuracy_s"]) == {"0.5", "0.8", "0.9", "0.95"}
    with open(os.path.join(out, "clients.csv"), encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0])[-5:] == ["speed_macs_per_s", "down_bytes_per_s", "up_bytes_per_s", "latency_s", "wait_share"]
    for row in rows:
        device = next(t for t in TIERS["tiers"] if t["width"] == float(row["p_max"]))
        assert float(row["speed_macs_per_s"]) == device["speed"]
        assert row["wait_share"] == "" or 0.0 <= float(row["wait_share"]) < 1.0


def test_a_deadline_drops_exactly_the_clients_too_slow_for_it(tmp_path):
    probe, _, _, _ = run(tmp_path, "probe", devices=TIERS, rounds=1)
    participants = sample_participants(3, 0, 6, 3)
    times = sorted(hand_seconds(probe, i, probe.p_max[i]) for i in participants)
    deadline = (times[0] + times[1]) / 2  # only the fastest makes it in round 0
    engine, summary, lines, _ = run(tmp_path, "drop", devices=TIERS, deadline=deadline)
    for t, line in enumerate(lines):
        round_times = {i: hand_seconds(engine, i, engine.p_max[i]) for i in sample_participants(3, t, 6, 3)}
        late = [i for i, s in round_times.items() if s > deadline]
        assert line["late_updates"] == len(late)
        assert line["round_time_s"] == (deadline if late else max(round_times.values()))
        assert line["bytes_up"] == sum(4 * cost_table("digits", widths=(engine.p_max[i],))[0]["params"]
                                       for i in round_times if i not in late)
    assert lines[0]["late_updates"] == 2 and summary["late_updates"] == sum(l["late_updates"] for l in lines)


def test_partial_work_reaches_the_trainer_as_a_step_limit(tmp_path):
    probe, _, _, _ = run(tmp_path, "probe", devices=TIERS, rounds=1)
    participants = sample_participants(3, 0, 6, 3)
    slowest = max(participants, key=lambda i: hand_seconds(probe, i, probe.p_max[i]))
    deadline = hand_seconds(probe, slowest, probe.p_max[slowest], steps=1) + 1e-6  # one step fits
    engine = Engine(RunConfig(**{**TINY, "rounds": 1, "devices": TIERS, "deadline": deadline,
                                 "deadline_policy": "partial"}))
    engine.prepare()
    seen = {}
    run_round = engine.backend.run_round

    def spy(tasks, weights, server_lr):
        seen.update({task.client: task.max_steps for task in tasks})
        results, aggregate = run_round(tasks, weights, server_lr)
        seen.update({("steps", r.client): r.steps for r in results})
        return results, aggregate

    engine.backend.run_round = spy
    engine.run()
    line = engine.history[0]
    assert seen[slowest] == 1 and seen[("steps", slowest)] == 1 and line["partial_updates"] >= 1
    assert line["round_time_s"] <= deadline


def test_overselection_invites_more_and_keeps_k(tmp_path):
    _, summary, lines, _ = run(tmp_path, "over", devices=TIERS, deadline_policy="overselect", overselect=0.5)
    for line in lines:
        assert line["invited"] == 5 and sum(line["participants_by_tier"].values()) == 3
        assert line["late_updates"] == 2


def test_markov_availability_and_dropout_run_and_resume_exactly(tmp_path):
    keys = dict(devices="lognormal", availability="markov:600,300", dropout=0.3, deadline=30.0, rounds=4,
                checkpoint_every=2)
    reference, ref_summary, ref_lines, ref_out = run(tmp_path, "reference", **keys)
    assert sum(line["dropped_updates"] for line in ref_lines) > 0
    out = str(tmp_path / "run")
    Engine(RunConfig(**{**TINY, **keys, "rounds": 2}), out_dir=out).run()  # checkpointed after round 1
    resumed = Engine(RunConfig(**{**TINY, **keys}), out_dir=out, resume=True, force=True).run()
    assert resumed["params_sha256"] == ref_summary["params_sha256"]
    # (round 1 was the 2-round run's last: evaluated at every width there, so only the clock's keys are compared)
    strip = lambda lines: [{k: line[k] for k in CLOCK_KEYS | {"test_accuracy"}} for line in lines]  # noqa: E731
    assert strip(lines_of(out)) == strip(ref_lines)
    with open(os.path.join(out, "clients.csv"), encoding="utf-8") as a, \
            open(os.path.join(ref_out, "clients.csv"), encoding="utf-8") as b:
        assert a.read() == b.read()


def test_the_example_plugin_picks_widths_that_meet_the_deadline(tmp_path):
    deadline = 2.0
    engine = Engine(RunConfig(**{**TINY, "algorithm": PLUGIN, "devices": SAMPLE, "availability": "always",
                                 "clients": 20, "clients_per_round": 10, "deadline": deadline}))
    engine.prepare()
    algorithm = engine.algorithm.algorithm
    participants = list(range(20))
    widths = algorithm.allocate(0, participants)
    ladder = [0.25, 0.5, 0.75, 1.0]
    for client, width in widths.items():
        allowed = [w for w in ladder if w <= engine.p_max[client]]
        fits = [w for w in allowed if algorithm.round_seconds(0, client, w) <= deadline]
        assert width == (max(fits) if fits else allowed[0])
    assert len(set(widths.values())) > 1 and any(w < engine.p_max[c] for c, w in widths.items())
    summary = engine.run()
    heterofl = Engine(RunConfig(**{**TINY, "devices": SAMPLE, "availability": "always", "clients": 20,
                                   "clients_per_round": 10, "deadline": deadline})).run()
    assert summary["late_updates"] < heterofl["late_updates"]


def test_scaffold_moves_its_control_variates_and_fedprox_computes_its_term(tmp_path):
    engine = Engine(RunConfig(**{**TINY, "algorithm": "scaffold", "devices": TIERS}))
    engine.prepare()
    clock, algorithm = engine.clock, engine.algorithm
    base = clock.base_cost(0, 1.0)
    cost = algorithm.client_cost(0, 0, 1.0, base)
    params = cost_table("digits", widths=(1.0,))[0]["params"]
    assert (cost.bytes_down, cost.bytes_up) == (2 * 4 * params, 2 * 4 * params)
    assert (cost.step_macs - base.step_macs).tolist() == [params] * base.steps
    prox = Engine(RunConfig(**{**TINY, "algorithm": "fedprox", "devices": TIERS}))
    prox.prepare()
    cost = prox.algorithm.client_cost(0, 0, 1.0, base)
    assert cost.bytes_up == base.bytes_up and (cost.step_macs - base.step_macs).tolist() == [params] * base.steps


@pytest.mark.parametrize("flags, phrase", [
    (["--deadline", "-5", "--devices", "lognormal"], "deadline is -5.0; expected a number of simulated seconds > 0"),
    (["--devices", "lognormal", "--deadline", "5", "--deadline-policy", "late"], "deadline_policy is 'late'"),
    (["--devices", "lognormal", "--dropout", "1"], "dropout is 1.0; expected a probability in [0, 1)"),
    (["--deadline", "5"], "but devices is not set"),
    (["--devices", "lognormal", "--overselect", "0.3"], "overselect is 0.3 but deadline_policy is 'drop'"),
    (["--devices", "gamma"], "devices is 'gamma'; expected a trace PATH.csv"),
    (["--devices", "lognormal", "--availability", "markov:5"], "availability is 'markov:5'"),
    (["--devices", "lognormal", "--availability", "trace"], "availability is 'trace' but devices is"),
    (["--devices", "MISSING.csv"], "device trace 'MISSING.csv' could not be read"),
])
def test_bad_clock_input_is_one_sentence_and_exit_2(tmp_path, flags, phrase):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1", "--quiet",
                                       "--out", str(tmp_path / "run"), *flags])
    assert result.exit_code == 2, result.output
    assert phrase in result.output and "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


def test_a_malformed_trace_file_is_refused_before_anything_is_written(tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\n0,1,1,1\n")
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1", "--quiet", "--devices",
                                       str(trace), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "has 4 fields on line 2" in result.output
    assert not os.path.exists(tmp_path / "run")


def test_the_clock_keys_are_config_keys():
    config = RunConfig.from_dict({"devices": {"distribution": "pareto", "speed_shape": 3}, "deadline": 9,
                                  "deadline_policy": "overselect"})
    assert config.devices["speed_shape"] == 3.0 and config.devices["speed_min"] == 1e9
    assert (config.deadline, config.overselect) == (9.0, 0.3)
    with pytest.raises(ConfigError, match="devices has unknown key 'speed_max'"):
        RunConfig(devices={"distribution": "pareto", "speed_max": 3})
