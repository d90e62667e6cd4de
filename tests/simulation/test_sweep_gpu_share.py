"""--cells-per-gpu K: a CUDA cell's Ray task asks for 1/K of a GPU, so K cells share one card at once. Checked on
CPU with a GPU resource declared to Ray (the cells' bodies are replaced by a stand-in that waits at a gate: no CUDA
here)."""

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.sweep import Cell

ray = pytest.importorskip("ray", reason="needs Ray")



@pytest.fixture(scope="module")
def one_gpu_cluster():
    ray.init(address="local", num_cpus=8, num_gpus=1, include_dashboard=False, object_store_memory=128 * 1024 ** 2,
             logging_level="warning")
    yield
    ray.shutdown()


def cells(n):
    return [Cell(name=f"c{i}", dataset="digits", algorithm="hasfl", seed=i, dir=f"/nonexistent/c{i}",
                 values={"device": "cuda", "trainer_threads": 1}) for i in range(n)]


@ray.remote(num_cpus=0)
class Gate:
    """Counts the cells inside at once; a cell's group of k (tickets in arrival order) waits until all of it has
    arrived, so k cells are inside together however slowly Ray starts its workers (no timer decides the test)."""

    def __init__(self, k: int, n: int):
        self.k, self.n, self.arrived, self.inside, self.peak = k, n, 0, 0, 0

    def enter(self) -> int:
        self.arrived += 1
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        return self.arrived

    def ready(self, ticket: int) -> bool:
        group_end = min(-(-ticket // self.k) * self.k, self.n)
        return self.arrived >= group_end

    def leave(self) -> int:
        self.inside -= 1
        return self.peak

    def most_inside(self) -> int:
        return self.peak


def run_all(executor, n, k):
    gate = Gate.remote(k, n)

    def stand_in(cell, force, cwd, command_line):  # nested: Ray ships it by value (workers cannot import this module)
        """Hold the cell's GPU share until its group of k is inside; report which GPU Ray gave it."""
        import time as clock

        import ray as worker_ray

        ticket = worker_ray.get(gate.enter.remote())
        deadline = clock.time() + 120
        while not worker_ray.get(gate.ready.remote(ticket)):
            if clock.time() > deadline:  # fewer than k ran at once: the test fails on its status, not on a hang
                worker_ray.get(gate.leave.remote())
                return {"name": cell["name"], "status": "its group never came in together"}
            clock.sleep(0.01)
        worker_ray.get(gate.leave.remote())
        return {"name": cell["name"], "status": "done", "gpu_ids": [str(g) for g in worker_ray.get_gpu_ids()]}

    executor.remote = ray.remote(stand_in)
    for cell in cells(n):
        executor.submit(cell)
    results = [executor.wait()[1] for _ in range(n)]
    return results, ray.get(gate.most_inside.remote())


@pytest.mark.parametrize("k", [1, 2, 4])
def test_k_cells_share_one_gpu_at_once(one_gpu_cluster, k):
    from hasfl_ray.simulation.sweep import RayExecutor

    executor = RayExecutor(cells_per_gpu=k)
    assert executor.resources(cells(1)[0]) == (1, pytest.approx(1 / k))
    results, most_inside = run_all(executor, 4, k)
    assert all(r["status"] == "done" for r in results), results
    assert most_inside == k  # k at once (each group waited for its k), never more (Ray's 1/k GPU each)
    assert all(r["gpu_ids"] == ["0"] for r in results)  # every share is of the one GPU


def test_cuda_cells_share_a_gpu_by_eight_unless_told(one_gpu_cluster):
    from hasfl_ray.simulation.sweep import DEFAULT_CELLS_PER_GPU, RayExecutor

    assert DEFAULT_CELLS_PER_GPU == 8
    assert RayExecutor().resources(cells(1)[0]) == (1, pytest.approx(1 / 8))
    assert RayExecutor(gpus_per_task=0.5).resources(cells(1)[0]) == (1, pytest.approx(0.5))  # --gpus-per-actor
    assert RayExecutor(cells_per_gpu=1).resources(cells(1)[0]) == (1, pytest.approx(1.0))


def test_cells_per_gpu_is_checked_and_named_in_the_first_line(tmp_path):
    from hasfl_ray.simulation.sweep import RayExecutor

    assert "0.25 GPU (4 per GPU)" in RayExecutor(cells_per_gpu=4).describe()
    config = tmp_path / "one.yaml"
    config.write_text("sweep: {datasets: [digits], algorithms: [hasfl], seeds: [42]}\n")
    for args, words in ((["--cells-per-gpu", "0"], "--cells-per-gpu is 0"),
                        (["--cells-per-gpu", "2", "--gpus-per-actor", "0.5"], "expected one of them"),
                        (["--cells-per-gpu", "2", "--backend", "local"], "--cells-per-gpu")):
        result = CliRunner().invoke(main, ["sweep", str(config), "--out", str(tmp_path / "out"), *args])
        assert result.exit_code == 2 and words in result.output, result.output
