"""Fixtures of the Ray tests: one small Ray instance a module."""

import pytest


@pytest.fixture(scope="module")
def ray_local():
    """Ray on this machine as the tests start it (2 CPUs, no dashboard, a 256 MB object store), shut down after the
    module."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 ** 2,
             logging_level="warning")
    yield
    ray.shutdown()
