"""A run whose global model is its row's first level (``global_width``, HeteroFL's ``global_model_rate``): the server
holds the level's network, clients train their r/G slices of it, and the local backend and Ray give the same bits
(the network's shapes and each client's slice are checked against HeteroFL's src/fed.py::split_model in
tests/models/test_heterofl_network.py)."""

import csv
import os

import pytest
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.participants import initial_parameters

#: Every run here names its backend: the tests mind no Ray already running in this process, so the shared Ray of the
#: module before is kept into this one (tests/conftest.py).
RAY_MAY_ALREADY_RUN = True

RUN = dict(dataset="digits", model="preresnet18-1112", width_mix="b1-e1", global_width="first", clients=6,
           clients_per_round=3, rounds=2, seed=5, algorithm="heterofl", local_epochs=1, eval_samples=64,
           device="cpu", checkpoint_every=0)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """RUN on the local backend, run once for both tests: the engine, its summary and its run directory."""
    out = tmp_path_factory.mktemp("local") / "run"
    engine = Engine(RunConfig(**RUN, backend="local"), out_dir=str(out))
    return engine, engine.run(), out


def test_the_server_holds_the_first_levels_network_and_clients_train_its_slices(tmp_path, local_run):
    engine, summary, out = local_run
    params = initial_parameters(engine.model_name, 0)  # the server's network (the same name in every process)
    assert params["conv1.weight"].shape[0] == 32  # ceil(0.5 * 64): level b's stem, not level a's 64 channels
    assert params["linear.weight"].shape == (10, 256)
    with open(os.path.join(str(out), "clients.csv"), encoding="utf-8") as f:
        widths = {float(row["p_max"]) for row in csv.DictReader(f)}
    assert widths <= {1.0, 0.125} and widths  # levels b and e as fractions of the level-b global model
    assert {float(w) for w in summary["accuracy_at_width_final"]} == {1.0, 0.125}  # the run's distinct p^max and 1
    full = Engine(RunConfig(**{**RUN, "global_width": 1.0}, backend="local"), out_dir=str(tmp_path / "full")).run()
    assert full["params_sha256"] != summary["params_sha256"]


def test_local_and_ray_agree_with_a_narrow_global_model(ray_local, tmp_path, local_run):
    local = local_run[1]
    ray_run = Engine(RunConfig(**RUN, backend="ray", actors=2), out_dir=str(tmp_path / "ray")).run()
    assert ray_run["params_sha256"] == local["params_sha256"]
