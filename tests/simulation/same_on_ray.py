"""Helper of the Ray-equals-local tests: one config run on the local backend and on Ray with two actors."""

import json

from hasfl_ray.engine import Engine, RunConfig


def backend_results(tmp_path, config):
    """params_sha256, metrics.jsonl (less wall_s) and clients.csv of ``config`` on each backend."""
    results = {}
    for backend, extra in (("local", {}), ("ray", {"actors": 2})):
        out = tmp_path / backend
        summary = Engine(RunConfig(backend=backend, **config, **extra), out_dir=str(out)).run()
        with open(out / "metrics.jsonl", encoding="utf-8") as handle:
            lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
        results[backend] = summary["params_sha256"], lines, (out / "clients.csv").read_text()
    return results
