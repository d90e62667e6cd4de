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


# -- one small Ray instance for the tests that run on a Ray started before them ------------------------------------
#: Ray on this machine as the tests start it: 2 CPUs, no dashboard, a 256 MB object store.
RAY_OPTIONS = dict(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 ** 2,
                   logging_level="warning")
SHARED_RAY = ("ray_local", "ray_shared")


def _asks_for_the_shared_ray(item) -> bool:
    """Whether ``item`` uses this conftest's ``ray_local`` or ``ray_shared`` (a module may define a ``ray_local`` of
    its own)."""
    info = getattr(item, "_fixtureinfo", None)
    for name in SHARED_RAY:
        definitions = info.name2fixturedefs.get(name, ()) if info is not None else ()
        if definitions and definitions[-1].func.__code__.co_filename == __file__:
            return True
    return False


def _next_module_starts_on_it(module) -> bool:
    """Whether the first test after ``module``'s last one is in another module and uses the shared Ray."""
    items = module.session.items
    mine = [i for i, item in enumerate(items) if item.module is module.obj]
    if not mine or mine[-1] + 1 >= len(items):
        return False
    following = items[mine[-1] + 1]
    return following.module is not module.obj and _asks_for_the_shared_ray(following)


def _idle(ray, seconds: float = 10.0) -> bool:
    """Whether the kept Ray has all its CPUs free (no actor a module left behind), waiting ``seconds`` at most for
    the actors the last run killed to hand theirs back."""
    import time

    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU", 0) != ray.cluster_resources().get("CPU", 0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def _ray_module(request):
    """A module's hold on the shared Ray. A start and a shutdown of Ray cost seconds each on a 2-core machine, so
    the Ray a module started is kept into the next module when that module's first test asks for it (the Ray
    tests' modules run one after another), checked idle there (else started afresh); every other module starts
    as before, with no Ray in this process."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        yield None
        return
    import ray

    if ray.is_initialized() and not _idle(ray):
        ray.shutdown()
    yield ray
    if ray.is_initialized() and not _next_module_starts_on_it(request.node):
        ray.shutdown()


@pytest.fixture
def ray_shared(_ray_module):
    """``ray_shared()``: start the shared Ray in this process (``RAY_OPTIONS``) unless it runs, for a test whose
    Ray half comes after a part that needs no Ray (and skips, saying why, where Ray is not installed)."""
    def start():
        if _ray_module is None:
            pytest.skip(reason="needs Ray")
        if not _ray_module.is_initialized():
            _ray_module.init(**RAY_OPTIONS)

    return start


@pytest.fixture
def ray_local(ray_shared):
    """Ray started in this process before the test (``RAY_OPTIONS``), again where an earlier test of the module
    shut it down; the test skips, saying why, where Ray is not installed."""
    ray_shared()
