"""Helper of the Ray-equals-local tests: one config run on the local backend and on Ray with two actors."""

import json

from hasfl_ray.engine import Engine, RunConfig


def backend_results(tmp_path, config, placements=()):
    """params_sha256, metrics.jsonl (less wall_s) and clients.csv of ``config`` on each backend: ``local``, ``ray``
    (two actors, the server where auto puts it: in the driver) and ``ray-P`` for each server placement P of
    ``placements`` (``actor``, ``driver``)."""
    results = {}
    runs = [("local", "local", {}), ("ray", "ray", {"actors": 2})]
    runs += [(f"ray-{p}", "ray", {"actors": 2, "server_placement": p}) for p in placements]
    for name, backend, extra in runs:
        out = tmp_path / name
        summary = Engine(RunConfig(backend=backend, **config, **extra), out_dir=str(out)).run()
        with open(out / "metrics.jsonl", encoding="utf-8") as handle:
            lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
        results[name] = summary["params_sha256"], lines, (out / "clients.csv").read_text()
    return results
