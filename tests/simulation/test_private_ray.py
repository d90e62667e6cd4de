"""Ray is ours unless the user says otherwise (issue 37 item 1): without --address or RAY_ADDRESS, the one start of
Ray (`connect_ray`, behind simulate, sweep and the hand-off) asks for a private instance, ``ray.init(address="local")``,
which Ray documents as starting a new local instance even where one runs; a bare ``ray.init()`` joins the latest
`ray start` head on the machine (its installed code would run our cells, and its fixed CPU count refuses ours). With
an address (flag or RAY_ADDRESS) it joins that cluster, as before."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray import simulation  # noqa: E402


class Calls:
    def __init__(self):
        self.kwargs = []

    def init(self, *args, **kwargs):
        assert not args
        self.kwargs.append(kwargs)


@pytest.fixture
def fake_ray(monkeypatch):
    calls = Calls()
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", calls.init)
    monkeypatch.setattr(simulation, "probe_address", lambda address, source, seconds=None: address)
    return calls


def test_without_an_address_ray_starts_a_private_instance(fake_ray, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert simulation.connect_ray(None, {"num_cpus": 2}, warn=False)
    assert fake_ray.kwargs == [dict(address="local", include_dashboard=False, logging_level=30, num_cpus=2)]


@pytest.mark.parametrize("flag,env", [("10.0.0.1:6379", None), (None, "10.0.0.2:6379")])
def test_an_address_given_joins_that_cluster(fake_ray, monkeypatch, flag, env):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if env:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert simulation.connect_ray(flag, {"num_cpus": 2}, warn=False)
    assert [k["address"] for k in fake_ray.kwargs] == [flag or env]
    assert "num_cpus" not in fake_ray.kwargs[0]
