"""A two-node Ray cluster on one machine (ray.cluster_utils.Cluster) gives the local backend's result bit for bit."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")
from ray.cluster_utils import Cluster  # noqa: E402

from hasfl_ray.engine import Engine, RunConfig  # noqa: E402

DIGITS = dict(rounds=3, clients=10, clients_per_round=5, seed=8)


@pytest.fixture(scope="module")
def two_nodes():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False,
                                                                object_store_memory=128 * 1024 ** 2))
    cluster.add_node(num_cpus=1, object_store_memory=128 * 1024 ** 2)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_two_nodes_equal_the_local_backend(two_nodes):
    local = Engine(RunConfig(**DIGITS, backend="local"))
    reference = local.run()
    # One trainer per node: each node has one CPU and each trainer reserves one.
    clustered = Engine(RunConfig(**DIGITS, backend="ray", actors=2, address=two_nodes.address))
    summary = clustered.run()
    assert clustered.backend.nodes == 2
    assert clustered.backend.plan.server == "actor"  # a cluster joined by address: the server on an actor (auto)
    assert summary["params_sha256"] == reference["params_sha256"]
    strip = [[{k: v for k, v in line.items() if k != "wall_s"} for line in engine.history]
             for engine in (local, clustered)]
    assert strip[0] == strip[1]
    assert not ray.is_initialized()  # joined with --address: the backend disconnects, the cluster stays up


def test_many_virtual_clients_on_two_nodes_equal_one_node(two_nodes, tmp_path):
    # 20,000 synthetic clients generated where they are trained: the dataset travels through the object store (the
    # driver ray.put()s it once), so the second node needs no data of its own.
    many = dict(dataset="synthetic", rounds=2, clients=20_000, clients_per_round=6, seed=3, warmup=0, t_adapt=1,
                checkpoint_every=0)
    one = Engine(RunConfig(**many, backend="local"), out_dir=str(tmp_path / "one")).run()
    clustered = Engine(RunConfig(**many, backend="ray", actors=2, address=two_nodes.address),
                       out_dir=str(tmp_path / "two"))
    two = clustered.run()
    assert clustered.backend.nodes == 2
    assert two["params_sha256"] == one["params_sha256"]
    for name in ("clients.csv",):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
