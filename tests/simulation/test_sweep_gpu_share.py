"""--cells-per-gpu K: a CUDA cell's Ray task asks for 1/K of a GPU, so K cells share one card at once. Checked on
CPU with a GPU resource declared to Ray (the cells' bodies are replaced by a timed stand-in: no CUDA here)."""

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


def run_all(executor, n):
    def stand_in(cell, force, cwd):  # nested, so Ray ships it by value (workers cannot import this test module)
        """Hold the cell's GPU share for a while; report when it ran and which GPU Ray gave it."""
        import time as clock

        import ray as worker_ray

        start = clock.time()
        clock.sleep(1.5)
        return {"name": cell["name"], "status": "done", "start": start, "end": clock.time(),
                "gpu_ids": [str(g) for g in worker_ray.get_gpu_ids()]}

    executor.remote = ray.remote(stand_in)
    for cell in cells(n):
        executor.submit(cell)
    return [executor.wait()[1] for _ in range(n)]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_k_cells_share_one_gpu_at_once(one_gpu_cluster, k):
    from hasfl_ray.simulation.sweep import RayExecutor

    executor = RayExecutor(cells_per_gpu=k)
    assert executor.resources(cells(1)[0]) == (1, pytest.approx(1 / k))
    results = run_all(executor, 4)
    assert all(r["status"] == "done" for r in results), results
    starts = sorted(r["start"] for r in results)
    ends = sorted(r["end"] for r in results)
    overlapping = sum(1 for s in starts if s < ends[0])  # cells running before the first one ended
    assert overlapping == k
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
