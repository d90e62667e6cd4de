"""A two-node Ray cluster on one machine (ray.cluster_utils.Cluster) gives the local backend's result bit for bit."""

import pytest

ray = pytest.importorskip("ray")
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
    assert summary["params_sha256"] == reference["params_sha256"]
    strip = [[{k: v for k, v in line.items() if k != "wall_s"} for line in engine.history]
             for engine in (local, clustered)]
    assert strip[0] == strip[1]
    assert not ray.is_initialized()  # joined with --address: the backend disconnects, the cluster stays up
