"""A plug-in model from a file (examples/tiny_vit.py) on two Ray actors: the actors build it from the class the
dataset carries (its module shipped by value: they cannot import it by name) and the run equals the local
backend's bit for bit."""

import json
import os

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray.engine import Engine, RunConfig  # noqa: E402

VIT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                   "tiny_vit.py") + ":TinyViT"
RUN = dict(dataset="digits", algorithm="hasfl", model=VIT, rounds=2, clients=6, clients_per_round=3, local_epochs=1,
           warmup=1, t_adapt=1, seed=7, checkpoint_every=0)


def run(backend: str, out, **extra):
    """(params_sha256, the metrics lines less their wall times) of the run on ``backend``."""
    summary = Engine(RunConfig(backend=backend, **RUN, **extra), out_dir=str(out)).run()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return summary["params_sha256"], [{k: v for k, v in m.items() if k != "wall_s"} for m in metrics]


def test_a_file_plugin_model_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    local = run("local", tmp_path / "local")
    on_ray = run("ray", tmp_path / "ray", actors=2)
    assert on_ray == local and len(local[1]) == 2
    assert "# actors: 2" in (tmp_path / "ray" / "config.yaml").read_text()
