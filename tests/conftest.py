"""Shared fixtures: deterministic torch settings and paths to the real data samples beside the repo."""

import os

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _exact_float32():
    """Every test starts in the deterministic mode a run uses (exact float32: no TF32 in cuDNN convolutions or
    matmuls), whatever an earlier test left: a test that builds a Trainer without an Engine would otherwise
    inherit torch's TF32 cuDNN default on a GPU, or another test's fast mode."""
    from hasfl_ray.training.determinism import apply_determinism

    apply_determinism(True)
    yield


@pytest.fixture
def shared_data():
    """Path of ../shared/data; tests using it skip, with the reason, where the folder is absent."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(reason="needs ../shared/data (real dataset samples beside the repository)")
    return SHARED_DATA
