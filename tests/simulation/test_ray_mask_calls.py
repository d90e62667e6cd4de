"""What a client's task holds on its way to the trainers (h54): a trainer call carries its clients' bitmasks (fiarse,
fedgmr) and their objectives' tensors (SCAFFOLD's correction, DepthFL's FedDyn h) in one packed buffer
(hasfl_ray/simulation/wire.py, ``pack_units``), never as tensors pickled one by one (a FIARSE client's dozen
bitmasks: 270 KB and ~23 ms of the driver's pickling for 25 digits clients, 196 KB packed; a SCAFFOLD client's
correction, a view of its flat vector per parameter, each pickled with the whole vector: 2.5 MB where it holds
213 KB), synchronous and asynchronous, a killed trainer's clients included, with the local backend's bits; and the
fault injection's warning counts the clients it kills, not the calls."""

import re

import pytest
import torch

ray = pytest.importorskip("ray", reason="needs Ray")
from ray.actor import ActorMethod  # noqa: E402

from hasfl_ray.engine import Engine, RunConfig  # noqa: E402

SYNC = dict(dataset="digits", algorithm="fiarse", rounds=3, clients=12, clients_per_round=6, seed=3,
            checkpoint_every=0)
ASYNC = dict(dataset="digits", algorithm="fedgmr", mode="async", devices="lognormal", clients=8, clients_per_round=4,
             local_epochs=1, seed=5, concurrency=4, rounds=5, buffer_size=2, async_rule="fedbuff", checkpoint_every=0,
             algorithm_options={"fedgmr_restore_rounds": 4, "fedgmr_restore_every": 1})


def tensors_in(value, seen=None) -> int:
    """How many torch tensors ``value`` holds (dicts, lists, tuples, objects' attributes), as pickling meets them."""
    seen = set() if seen is None else seen
    if id(value) in seen or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return 0
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(tensors_in(item, seen) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensors_in(item, seen) for item in value)
    return sum(tensors_in(item, seen) for item in getattr(value, "__dict__", {}).values())


@pytest.fixture
def trainer_calls(monkeypatch):
    """Every TrainerActor.run call this driver makes: (its units argument, how many tensors it carries)."""
    calls = []
    original = ActorMethod._remote

    def spy(self, args=None, kwargs=None, **options):
        if self._method_name == "run":
            calls.append((args[1], tensors_in(args[1])))
        return original(self, args, kwargs, **options)

    monkeypatch.setattr(ActorMethod, "_remote", spy)
    return calls


def summary_of(tmp_path, name, config):
    return Engine(RunConfig(**config), out_dir=str(tmp_path / name)).run()["params_sha256"]


@pytest.fixture(scope="module")
def sync_local(tmp_path_factory):
    """params_sha256 of SYNC on the local backend, run once for both server placements."""
    return summary_of(tmp_path_factory.mktemp("sync"), "local", {**SYNC, "backend": "local"})


@pytest.mark.parametrize("placement", ["driver", "actor"])
def test_a_mask_rounds_calls_carry_no_tensors_and_a_killed_trainer_changes_no_bit(ray_local, tmp_path, trainer_calls,
                                                                                  caplog, sync_local, placement):
    local = sync_local
    killed = summary_of(tmp_path, "ray", {**SYNC, "backend": "ray", "actors": 2, "server_placement": placement,
                                          "fault_inject": "kill-trainer@1"})
    assert killed == local
    assert len(trainer_calls) >= 6  # every round's calls, the killed trainer's sent again
    assert [count for _, count in trainer_calls] == [0] * len(trainer_calls)
    # the warning counts the clients on the trainer it kills: those trained again
    [(killed_clients,)] = re.findall(r"killing trainer actor \d+ with (\d+) clients in flight", caplog.text)
    assert int(killed_clients) == caplog.text.count("training it again") >= 2


def test_an_asynchronous_fedgmr_dispatch_carries_no_tensors_and_equals_the_local_backend(ray_local, tmp_path,
                                                                                        trainer_calls):
    local = summary_of(tmp_path, "local", {**ASYNC, "backend": "local"})
    killed = summary_of(tmp_path, "ray", {**ASYNC, "backend": "ray", "actors": 2, "fault_inject": "kill-trainer@3"})
    assert killed == local
    assert len(trainer_calls) > ASYNC["rounds"]
    assert [count for _, count in trainer_calls] == [0] * len(trainer_calls)


@pytest.mark.parametrize("algorithm", ["scaffold", "depthfl"])
def test_objective_tensors_travel_packed_and_the_run_equals_the_local_backend(ray_local, tmp_path, trainer_calls,
                                                                             algorithm):
    config = {**SYNC, "algorithm": algorithm}
    local = summary_of(tmp_path, "local", {**config, "backend": "local"})
    ray_run = summary_of(tmp_path, "ray", {**config, "backend": "ray", "actors": 2})
    assert ray_run == local
    assert [count for _, count in trainer_calls] == [0] * len(trainer_calls)
    # the corrections (SCAFFOLD from round 1 on) and h (DepthFL) did travel: inside the packed buffer
    assert any(type(units).__name__ == "PackedTasks" for units, _ in trainer_calls)
