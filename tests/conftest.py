"""Shared fixtures: deterministic torch settings and paths to the real data samples beside the repo."""

import os
import signal

import pytest
import torch

# A shell without job control starts a background job (`pytest ... &`, nohup) with SIGINT ignored, and a child
# process inherits an ignored signal across exec: the tests that send Ctrl-C to a `hasfl-ray` they start would then
# see it ignored. The suite's own process takes Python's handler back, so its children start with SIGINT as from a
# terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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


@pytest.fixture
def crash_async_at(monkeypatch):
    """``crash_async_at(v)``: an asynchronous run (hasfl_ray.engine.asynchronous) raises KeyboardInterrupt when it is
    about to make server update ``v``, as a crash would; ``monkeypatch.undo()`` disarms it before the resume."""
    from hasfl_ray.engine.asynchronous import AsyncLoop

    original = AsyncLoop.server_update

    def arm(version: int) -> None:
        def crash(self, wall_start):
            if self.state.version == version:
                raise KeyboardInterrupt
            return original(self, wall_start)

        monkeypatch.setattr(AsyncLoop, "server_update", crash)

    return arm
