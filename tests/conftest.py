"""Shared fixtures: deterministic torch settings, paths to the real data samples beside the repo, and one small Ray
instance for the tests that run on a Ray started before them (``ray_local``, ``ray_shared``), kept from one module to
the next where that module welcomes it; the modules using it run last in their folder."""

import os
import signal
import sys

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


def _welcomes(module_items) -> bool:
    """Whether a module (its tests, in order) may start on the shared Ray kept from the module before: its first
    test asks for it, or the module says ``RAY_MAY_ALREADY_RUN = True`` (none of its tests minds a Ray running in
    this process) and some test asks for it."""
    if not module_items:
        return False
    if _asks_for_the_shared_ray(module_items[0]):
        return True
    return getattr(module_items[0].module, "RAY_MAY_ALREADY_RUN", False) is True and \
        any(_asks_for_the_shared_ray(item) for item in module_items)


def _items_of(session, module) -> list:
    return [item for item in session.items if item.module is module]


def _following_module_items(module_node) -> list:
    """The tests of the module that runs after ``module_node``'s (none at the session's end)."""
    items = module_node.session.items
    mine = [i for i, item in enumerate(items) if item.module is module_node.obj]
    if not mine or mine[-1] + 1 >= len(items):
        return []
    return _items_of(module_node.session, items[mine[-1] + 1].module)


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


#: the session name of the Ray ``ray_shared`` started (None: none), and whether it is kept into the next module
_SHARED = {"session": None, "kept": False}


def _shared_ray_running():
    """The ray module while the Ray ``ray_shared`` started runs in this process, else None."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    node = getattr(getattr(ray, "_private", None) and ray._private.worker, "_global_node", None)
    return ray if getattr(node, "session_name", None) == _SHARED["session"] else None


@pytest.fixture(scope="module", autouse=True)
def _ray_between_modules(request):
    """A start and a shutdown of Ray cost seconds each on a 2-core machine, so the shared Ray a module started is
    kept into the next module when that one welcomes it (:func:`_welcomes`; the Ray tests' modules run one after
    another, see ``pytest_collection_modifyitems``) and is idle there (else stopped, ``ray_shared`` starts it
    afresh); it is stopped before every other module, which starts as before, with no Ray in this process."""
    ray = _shared_ray_running()
    if _SHARED["kept"] and ray is not None and not (_welcomes(_items_of(request.session, request.module)) and
                                                    _idle(ray)):
        ray.shutdown()
    _SHARED["kept"] = False
    yield
    ray = _shared_ray_running()
    if ray is not None:
        if _welcomes(_following_module_items(request.node)):
            _SHARED["kept"] = True
        else:
            ray.shutdown()


@pytest.fixture
def ray_shared():
    """``ray_shared()``: start the shared Ray in this process (``RAY_OPTIONS``) unless it runs, for a test whose
    Ray half comes after a part that needs no Ray (and skips, saying why, where Ray is not installed)."""
    def start():
        ray = pytest.importorskip("ray", reason="needs Ray")
        if not ray.is_initialized():
            ray.init(**RAY_OPTIONS)
            _SHARED["session"] = ray._private.worker._global_node.session_name

    return start


@pytest.fixture
def ray_local(ray_shared):
    """Ray started in this process before the test (``RAY_OPTIONS``), again where an earlier test of the module
    shut it down; the test skips, saying why, where Ray is not installed."""
    ray_shared()


def pytest_collection_modifyitems(session, config, items):
    """Within each folder, the modules with tests on the shared Ray run last, one after another, each whole and in
    name order (the others first, in name order): the Ray one module started is then kept into the next (see
    ``_ray_between_modules``) instead of being stopped and started again between them."""
    modules, order = {}, []
    for item in items:
        key = item.nodeid.split("::")[0]
        if key not in modules:
            modules[key] = []
            order.append(key)
        modules[key].append(item)
    shared = {key for key in order if any(_asks_for_the_shared_ray(item) for item in modules[key])}
    folders = {}
    for key in order:
        folders.setdefault(key.rpartition("/")[0], []).append(key)
    items[:] = [item for folder in folders.values()
                for key in sorted(folder, key=lambda k: k in shared)  # a stable sort: name order kept in each part
                for item in modules[key]]
