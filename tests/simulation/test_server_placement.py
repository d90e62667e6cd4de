"""Where a Ray run's server runs (--server-placement, docs/ray.md): in the driver on a CPU run that starts Ray here,
on an actor of its own on a GPU or a joined cluster; the same bits either way, and a run checkpointed with the server
in one place resumed with it in the other is the uninterrupted run."""

import json

import pytest

from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.simulation.placement import SERVER_GPU_SHARE, execution, plan_actors, server_placement


def refused(args, *words):
    """``hasfl-ray ARGS`` refused with exit status 2 in one sentence holding ``words``, no traceback."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    message = result.output.strip()
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), message
    assert len(message.splitlines()) == 1 and message.startswith("Error: "), message
    assert all(word in message for word in words), message


@pytest.mark.parametrize("kw, device, expected", [
    ({}, "cpu", "driver"),  # a CPU run on a Ray of this machine: no hop through a server actor
    ({}, "cuda", "actor"),  # on a GPU: its share of one beside a trainer, where the trainers' results are
    (dict(address="10.0.0.1:6379"), "cpu", "actor"),  # a cluster joined by address: the driver may be far from it
    (dict(server_placement="auto"), "cpu", "driver"),
    (dict(server_placement="actor"), "cpu", "actor"),
    (dict(server_placement="driver"), "cuda", "driver"),
])
def test_auto_puts_the_server_in_the_driver_on_a_cpu_run_that_starts_ray_here(monkeypatch, kw, device, expected):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert server_placement(RunConfig(backend="ray", **kw), device) == expected


def test_ray_address_in_the_environment_keeps_the_server_on_an_actor(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert server_placement(RunConfig(backend="ray"), "cpu") == "actor"


def test_the_plan_records_where_the_server_runs_and_a_driver_server_asks_ray_for_no_gpu(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cpu = plan_actors(RunConfig(backend="ray"), cluster_cpus=2, cluster_gpus=0)
    assert cpu.server == "driver" and execution(RunConfig(backend="ray"), cpu, 1)["server"] == "driver"
    gpu = plan_actors(RunConfig(backend="ray", device="cuda"), cluster_cpus=8, cluster_gpus=2)
    assert (gpu.server, gpu.server_gpus) == ("actor", SERVER_GPU_SHARE)
    driver = plan_actors(RunConfig(backend="ray", device="cuda", server_placement="driver"), 8, 2)
    assert (driver.server, driver.server_gpus) == ("driver", 0.0)


def test_a_placement_that_is_none_of_the_three_or_on_the_local_backend_is_one_sentence(tmp_path):
    with pytest.raises(ConfigError, match=r"server_placement is 'gpu'; expected auto, driver or actor"):
        RunConfig(backend="ray", server_placement="gpu")
    with pytest.raises(ConfigError, match=r"server_placement is 'driver' but backend is 'local'; expected backend ray"):
        RunConfig(backend="local", server_placement="driver")
    refused(["simulate", "--backend", "ray", "--server-placement", "gpu", "--out", tmp_path / "a"],
            "server_placement is 'gpu'", "auto, driver or actor")
    refused(["simulate", "--backend", "local", "--server-placement", "actor", "--out", tmp_path / "b"],
            "server_placement is 'actor'", "backend ray")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


CONFIG = dict(dataset="digits", algorithm="hasfl", clients=8, clients_per_round=4, rounds=5, local_epochs=1,
              seed=5, checkpoint_every=2, eval_samples=120)


def lines(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


@pytest.mark.parametrize("before, after", [("driver", "actor"), ("actor", "driver")])
def test_a_run_checkpointed_with_the_server_in_one_place_resumes_in_the_other_bit_for_bit(ray_local, tmp_path,
                                                                                          before, after):
    from hasfl_ray.engine import Engine

    reference = Engine(RunConfig(backend="local", **CONFIG), out_dir=str(tmp_path / "local")).run()
    config = dict(backend="ray", actors=2, **CONFIG)
    with pytest.raises(Exception, match="injected trainer failure"):
        Engine(RunConfig(**config, server_placement=before, fault_inject="trainer-error@3"),
               out_dir=str(tmp_path / "run")).run()
    engine = Engine(RunConfig(**config, server_placement=after), out_dir=str(tmp_path / "run"), resume=True)
    resumed = engine.run()
    assert engine.backend.plan.server == after and len(engine.backend.places) == (3 if after == "actor" else 2)
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert lines(tmp_path / "run") == lines(tmp_path / "local")


def test_a_sweep_refuses_a_server_placement_its_local_cells_would_not_use(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text("rounds: 1\nclients: 4\nclients_per_round: 2\nsweep:\n  datasets: [digits]\n"
                      "  algorithms: [fedavg]\n  seeds: [0]\n")
    refused(["sweep", config, "--server-placement", "driver", "--out", tmp_path / "out"],
            "--server-placement is 'driver' but sweep cells run the local backend")
    assert not (tmp_path / "out").exists()
