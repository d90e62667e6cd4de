"""The first line of a sweep on Ray names a CUDA cell's GPU share only where it means something (issue h59): every
CPU sweep on a machine without a GPU said "a CUDA cell takes 0.125 GPU (8 per GPU)" of cells that never ask for one."""

import pytest

pytest.importorskip("ray", reason="needs Ray")


def test_a_sweep_on_a_cluster_without_gpus_names_no_gpu_share(ray_local):
    import ray

    from hasfl_ray.simulation.sweep import RayExecutor

    assert ray.cluster_resources().get("GPU", 0) == 0
    assert RayExecutor().describe() == "one Ray task per cell"
    # a share the user gave is still named (it is what a CUDA cell would ask for)
    assert RayExecutor(cells_per_gpu=4).describe() == "one Ray task per cell; a CUDA cell takes 0.25 GPU (4 per GPU)"
