"""The device clock on Ray (docs/clock.md): computed in the driver, so two actors give the local backend's clock —
round times, bytes, late, partial and dropped-out updates — and its params_sha256, bit for bit."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

CLOCKED = dict(rounds=3, clients=6, clients_per_round=3, local_epochs=1, seed=11, algorithm="heterofl",
               devices="lognormal", availability="markov:600,300", dropout=0.2, deadline=0.1,
               deadline_policy="partial", checkpoint_every=0)


def test_the_clock_and_the_model_are_the_same_on_two_ray_actors(ray_local, tmp_path):
    results = backend_results(tmp_path, CLOCKED)
    assert results["ray"] == results["local"]
    lines = results["local"][1]
    assert sum(line["partial_updates"] + line["late_updates"] for line in lines) > 0  # the deadline bit
    assert lines[-1]["sim_time_s"] > 0
