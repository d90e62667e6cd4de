"""Helper of the Ray-equals-local tests: one config run on the local backend and on Ray with two actors."""

import json

from hasfl_ray.engine import Engine, RunConfig


def result_of(out, config):
    """params_sha256, metrics.jsonl (less wall_s) and clients.csv of ``config`` (a RunConfig's keywords) run into
    ``out``."""
    summary = Engine(RunConfig(**config), out_dir=str(out)).run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
    return summary["params_sha256"], lines, (out / "clients.csv").read_text()


def backend_results(tmp_path, config, placements=(), local=None):
    """:func:`result_of` ``config`` on each backend: ``local``, ``ray`` (two actors, the server where auto puts it:
    in the driver) and ``ray-P`` for each server placement P of ``placements`` (``actor``, ``driver``). ``local``:
    the local backend's result when the caller ran it already (a module's shared run)."""
    results = {} if local is None else {"local": local}
    runs = [("local", "local", {})] if local is None else []
    runs += [("ray", "ray", {"actors": 2})] + [(f"ray-{p}", "ray", {"actors": 2, "server_placement": p})
                                              for p in placements]
    for name, backend, extra in runs:
        results[name] = result_of(tmp_path / name, dict(backend=backend, **config, **extra))
    return results
