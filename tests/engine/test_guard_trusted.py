"""The guard's per-dispatch checks skipped for a built-in algorithm's own methods (issue 46 item 2): the values are
those the checked path returns, and a plug-in's method (a subclass's override, or one set on the instance or on a
built-in's class from elsewhere) is still checked every call."""

import pytest

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.guard import GuardedAlgorithm
from hasfl_ray.engine.participants import sub_models
from hasfl_ray.errors import PluginError

PER_DISPATCH = ("allocate", "sub_model", "objective", "window_offset", "channel_sets", "client_cost")


def guarded(tmp_path, algorithm="hasfl"):
    engine = Engine(RunConfig(backend="local", clients=8, clients_per_round=4, rounds=1, seed=2, devices="lognormal",
                              algorithm=algorithm, checkpoint_every=0), out_dir=str(tmp_path / "run"))
    engine.prepare()
    return engine.algorithm, engine.clock


def calls(guard, clock):
    cost = clock.base_cost(3, 0.5)
    return [guard.allocate(0, [1, 3, 5]), type(guard.objective(0, 3, 0.5)).__name__, guard.window_offset(0, 3),
            guard.channel_sets(0, 3, 0.5), guard.client_cost(0, 3, 0.5, cost).bytes_down,
            sub_models(guard, 0, {1: 0.25, 3: 0.5, 5: 1.0})]


@pytest.mark.parametrize("algorithm", ["hasfl", "fedrolex", "fluid", "fedprox"])
def test_a_builtins_unchecked_calls_give_the_checked_values(tmp_path, monkeypatch, algorithm):
    guard, clock = guarded(tmp_path, algorithm)
    assert all(guard._trusted(method) for method in PER_DISPATCH)
    fast = calls(guard, clock)
    monkeypatch.setattr(GuardedAlgorithm, "_trusted", lambda self, method: False)
    checked = calls(guard, clock)
    assert fast == checked
    assert all(type(width) is float for width in fast[0].values())
    assert type(fast[2]) is int


def test_a_plugins_override_is_still_checked(tmp_path):
    guard, clock = guarded(tmp_path)

    class Override(type(guard.algorithm)):  # a plug-in's subclass of a built-in
        def allocate(self, round, participants):
            return {i: 1.5 for i in participants}

        def client_cost(self, round, client, width, cost):
            return "no cost"

    guard.algorithm.__class__ = Override
    assert not guard._trusted("allocate") and not guard._trusted("window_offset")  # (the class is a plug-in's)
    with pytest.raises(PluginError, match="width for client 1: 1.5 from allocate"):
        guard.allocate(0, [1])
    with pytest.raises(PluginError, match="client_cost"):
        guard.client_cost(0, 1, 0.5, clock.base_cost(1, 0.5))


def test_a_method_set_on_the_instance_or_the_class_is_checked(tmp_path, monkeypatch):
    guard, _ = guarded(tmp_path)
    guard.algorithm.sub_model = lambda round, client, width: (2.0, None)
    assert not guard._trusted("sub_model")
    with pytest.raises(PluginError, match="from sub_model"):
        sub_models(guard, 0, {2: 0.5})
    guard.algorithm.window_offset = lambda round, client: -1
    assert not guard._trusted("window_offset")
    with pytest.raises(PluginError, match="offset for client 2: -1 from window_offset"):
        guard.window_offset(0, 2)
    monkeypatch.setattr(type(guard.algorithm), "allocate", lambda self, round, participants: {0: 0.0})
    assert not guard._trusted("allocate")
    with pytest.raises(PluginError, match="allocate"):
        guard.allocate(0, [0])
