"""`hasfl-ray info`: versions, devices, and whether the compiled aggregation kernels are available."""

from __future__ import annotations

import json
import os
from typing import Dict

import click
import torch

from hasfl_ray import __version__
from hasfl_ray import allocator
from hasfl_ray.threads import actor_environment, wait_policy
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops import aggregate_private
from hasfl_ray.training.determinism import apply_determinism
from hasfl_ray.training.workspace import cache_bound_text


def collect_info() -> Dict[str, object]:
    """Everything `hasfl-ray info` prints, as one JSON-ready dict.

    ``determinism`` holds the settings every run applies in the driver, each trainer and the server (applied
    here the same way, before this process touches CUDA), and the flag that opts out of them.
    """
    determinism = {**apply_determinism(True), "opt_out": "--fast-nondeterministic (config key deterministic: false)"}
    try:
        import ray

        ray_version = ray.__version__
    except ImportError:
        ray_version = None
    devices = [{"device": "cpu", "name": "CPU", "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                "capability": torch.backends.cpu.get_cpu_capability()}]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            devices.append({"device": f"cuda:{index}", "name": properties.name,
                            "memory_gib": round(properties.total_memory / 2 ** 30, 1),
                            "capability": f"{properties.major}.{properties.minor}"})
    return {
        "hasfl_ray": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "ray": ray_version,
        "extension": {
            "built": ops.available(),
            "path": ops.extension_path(),
            "cpu_kernel": ops.available(),
            "cuda_kernel": ops.cuda_available(),
            "private_cuda_kernel": aggregate_private.cuda_available(),  # the DP ops' (not yet run on a card)
            "error": ops.load_error(),
        },
        "devices": devices,
        "determinism": determinism,
        "threads": {"torch_threads": torch.get_num_threads(), **wait_policy(),
                    "actors": "every Ray actor starts with " + ", ".join(f"{k}={v}" for k, v in
                                                                         actor_environment().items())},
        "freed_memory": allocator.status(),
        "large_tensors": allocator.pages(),
        "model_cache": cache_bound_text(),
        "primitive_cache": allocator.primitive_cache_status(),
    }


def _threads_line(threads: Dict[str, object]) -> str:
    return (f"OpenMP waits: OMP_WAIT_POLICY={threads['OMP_WAIT_POLICY']} (set by {threads['set_by']}; "
            f"{threads['actors']})")


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def info(as_json: bool) -> None:
    """Print versions, devices, and whether hasfl_ray._C and its CPU/CUDA kernels are available."""
    data = collect_info()
    if as_json:
        click.echo(json.dumps(data))
        return
    extension = data["extension"]
    click.echo(f"hasfl-ray {data['hasfl_ray']}, torch {data['torch']} (CUDA {data['torch_cuda'] or 'none'}), "
               f"ray {data['ray'] or 'not installed'}")
    built = f"yes ({extension['path']})" if extension["built"] else f"no ({extension['error'] or 'not found'})"
    click.echo(f"extension hasfl_ray._C: {built}")
    click.echo(f"  CPU kernel:  {_yes_no(extension['cpu_kernel'])}")
    click.echo(f"  CUDA kernel: {_yes_no(extension['cuda_kernel'])}"
               + ("" if extension["cuda_kernel"] else " (build with a GPU visible or HASFL_FORCE_CUDA=1)"))
    click.echo(f"  CUDA kernel of the DP ops: {_yes_no(extension['private_cuda_kernel'])}"
               + (" (compiled, not yet run on a card)" if extension["private_cuda_kernel"] else ""))
    click.echo(f"CUDA available: {_yes_no(data['cuda_available'])}")
    settings = data["determinism"]
    click.echo(f"determinism: {'on' if settings['deterministic'] else 'off'} (CUBLAS_WORKSPACE_CONFIG="
               f"{settings['cublas_workspace_config']}, deterministic algorithms, cuDNN deterministic, no cuDNN "
               f"benchmark, exact float32 with TF32 off; opt out with {settings['opt_out']})")
    for device in data["devices"]:
        if device["device"] == "cpu":
            click.echo(f"  cpu: {device['cores']} cores, {device['torch_threads']} torch threads, "
                       f"{device['capability']}")
        else:
            click.echo(f"  {device['device']}: {device['name']}, {device['memory_gib']} GiB, "
                       f"compute capability {device['capability']}")
    click.echo(_threads_line(data["threads"]))
    click.echo(f"Freed memory: {data['freed_memory']}")
    click.echo(f"Large tensors: {data['large_tensors']}")
    click.echo(f"Model cache: {data['model_cache']}")
    click.echo(f"Convolution primitives: {data['primitive_cache']}")
