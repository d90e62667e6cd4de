"""Fixtures of the algorithm tests."""

import pytest

from algorithm_runs import small_config


@pytest.fixture
def config4():
    """A resolved config for hand-made federations of 4 clients (HAS-FL defaults, 20 rounds)."""
    return small_config()
