"""OpenMP's waiting threads sleep (hasfl_ray/threads.py; issue 46 item 5): the console script sets
OMP_WAIT_POLICY=PASSIVE before torch loads unless the user chose a policy, every Ray actor's process starts with it,
and `hasfl-ray info` says which policy is in force."""

import json
import os
import subprocess
import sys

import pytest

from hasfl_ray import threads

BIN = os.path.dirname(sys.executable)


def test_passive_unless_the_user_chose():
    environ = {}
    assert threads.passive_waits(environ) == "PASSIVE" and environ["OMP_WAIT_POLICY"] == "PASSIVE"
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.passive_waits(chosen) == "ACTIVE" and chosen == {"OMP_WAIT_POLICY": "ACTIVE"}


@pytest.mark.parametrize("given, expected, by", [(None, "PASSIVE", "hasfl-ray"), ("ACTIVE", "ACTIVE", "the environment")])
def test_info_says_which_policy_the_cli_runs_with(given, expected, by):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "_HASFL_RAY_SET_OMP_WAIT_POLICY")}
    if given:
        env["OMP_WAIT_POLICY"] = given
    done = subprocess.run([os.path.join(BIN, "hasfl-ray"), "info", "--json"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)["threads"]
    assert (state["OMP_WAIT_POLICY"], state["set_by"]) == (expected, by)
    assert f"OMP_WAIT_POLICY={expected}" in state["actors"]
    text = subprocess.run([os.path.join(BIN, "hasfl-ray"), "info"], env=env, capture_output=True, text=True,
                          timeout=300).stdout
    assert f"OpenMP waits: OMP_WAIT_POLICY={expected} (set by {by};" in text


def test_every_ray_actor_starts_with_the_policy(ray_local, monkeypatch):
    pytest.importorskip("ray", reason="needs Ray")
    from hasfl_ray.engine import Engine, RunConfig

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # an API user's process: the actors get PASSIVE anyway
    engine = Engine(RunConfig(backend="ray", actors=2, rounds=1, clients=6, clients_per_round=3, seed=1,
                              server_placement="actor"))  # a server actor too (auto puts it in the driver here)
    seen = {}
    run_round = engine.run_round

    def watched(t):
        line = run_round(t)
        for place in engine.backend.places:  # the trainers, then the server
            with open(f"/proc/{place['pid']}/environ", "rb") as handle:
                entries = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
            seen[place["pid"]] = entries.get(b"OMP_WAIT_POLICY")
        return line

    engine.run_round = watched
    engine.run()
    assert len(seen) == 3 and set(seen.values()) == {b"PASSIVE"}


@pytest.mark.parametrize("given", ["", "bogus", "PASIVE"])
def test_a_value_openmp_does_not_take_is_replaced_by_passive(given):
    # h52: libgomp answers "Invalid value for environment variable OMP_WAIT_POLICY" and spins by default, while
    # `info` printed the value as the user's policy and every Ray actor started with it
    environ = {"OMP_WAIT_POLICY": given}
    assert threads.passive_waits(environ) == "PASSIVE" and environ["OMP_WAIT_POLICY"] == "PASSIVE"
    for chosen in ("active", " passive ", "Active"):  # libgomp's parse: any case, blanks around
        assert threads.passive_waits({"OMP_WAIT_POLICY": chosen}) == chosen
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "_HASFL_RAY_SET_OMP_WAIT_POLICY")}
    env["OMP_WAIT_POLICY"] = given
    done = subprocess.run([os.path.join(BIN, "hasfl-ray"), "info", "--json"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Invalid value" not in done.stderr  # torch loaded OpenMP with PASSIVE
    state = json.loads(done.stdout)["threads"]
    assert state["OMP_WAIT_POLICY"] == "PASSIVE"
    assert state["set_by"] == f"hasfl-ray, in place of the environment's {given!r}, which OpenMP does not take"
    assert "OMP_WAIT_POLICY=PASSIVE" in state["actors"]


def test_an_api_users_value_openmp_does_not_take_is_not_given_to_the_actors(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "")  # no console script ran: the actors still sleep
    assert threads.actor_environment()["OMP_WAIT_POLICY"] == "PASSIVE"
    assert threads.wait_policy()["OMP_WAIT_POLICY"].startswith("'' (not a policy OpenMP takes")
