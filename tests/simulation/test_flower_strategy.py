"""hasfl_ray.flower: a policy as a Flower strategy ends a federation in Flower's simulation with the same global
parameters as `hasfl-ray simulate --backend local` of the same config (same participants, seeds, widths and
aggregation); without Flower the module refuses in one sentence naming the extra.

The comparison runs Flower's own virtual environment (Flower pins its own Ray, so it is not installed beside
hasfl-ray's): `python benchmarks/bench_vs_flower.py --setup` creates it; without it that test is skipped, saying so
(CI does not build it)."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.environ.get("HASFL_FLOWER_VENV", os.path.join(os.path.expanduser("~"), ".cache", "hasfl-ray", "flower-venv"))
FLOWER_PYTHON = os.path.join(VENV, "bin", "python")
SCRIPT = os.path.join(ROOT, "tests", "simulation", "flower_federation.py")
MARK = "FLOWER_FEDERATION "

# A tiny digits federation; HAS-FL adapts its widths after every round from the first (warmup 0, t_adapt 1), so its
# second round's widths come from the first round's aggregate (the policy's observe) on both sides.
BASE = {"dataset": "digits", "clients": 6, "clients_per_round": 3, "rounds": 2, "seed": 3}
# FLuID (channel index sets, its inspect_updates hook) and DepthFL (depth sub-models, its post_aggregate hook) travel
# and aggregate the other kinds of sub-model.
POLICIES = {"hasfl": {"algorithm": "hasfl", "warmup": 0, "t_adapt": 1}, "heterofl": {"algorithm": "heterofl"},
            "fluid": {"algorithm": "fluid"}, "depthfl": {"algorithm": "depthfl"}}


def simulate_sha(tmp_path, config):
    """`hasfl-ray simulate --backend local` of ``config``: its summary's params_sha256 and metrics lines."""
    path, out = tmp_path / "config.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(config))
    result = CliRunner().invoke(main, ["simulate", "--config", str(path), "--backend", "local", "--out", str(out),
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text())["params_sha256"], lines


@pytest.mark.skipif(not os.path.exists(FLOWER_PYTHON),
                    reason="needs Flower's venv: python benchmarks/bench_vs_flower.py --setup")
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_flower_simulation_ends_with_simulates_global_parameters(tmp_path, policy):
    config = {**BASE, **POLICIES[policy]}
    # Ray's memory monitor off: this machine's memory is shared, and the federation itself needs little of it
    env = {**os.environ, "PYTHONPATH": ROOT, "RAY_DEDUP_LOGS": "0", "RAY_memory_monitor_refresh_ms": "0"}
    done = subprocess.run([FLOWER_PYTHON, SCRIPT, json.dumps(config)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    assert done.returncode == 0 and lines, (done.stdout[-3000:], done.stderr[-3000:])
    flower = json.loads(lines[-1][len(MARK):])
    from hasfl_ray.ops import available

    assert flower["fused"] == available()  # both sides aggregate with the same kernel (the fused one where built)
    sha, metrics = simulate_sha(tmp_path, config)
    assert [line["round"] for line in flower["history"]] == [0, 1]
    assert [line["accepted"] for line in flower["history"]] == [3, 3]  # each round's three participants trained
    assert [line["avg_p"] for line in flower["history"]] == pytest.approx([line["avg_p"] for line in metrics])
    assert [line["coverage"] for line in flower["history"]] == pytest.approx([line["coverage"] for line in metrics])
    for key in ("test_accuracy", "test_loss"):  # the strategy's central evaluation is the simulation's
        assert [line[key] for line in flower["history"]] == [line[key] for line in metrics]
    assert flower["params_sha256"] == sha


def test_without_flower_the_strategy_refuses_in_one_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr", None)  # `import flwr` now raises ImportError, installed or not
    from hasfl_ray import flower

    for make in (lambda: flower.Strategy("hasfl", BASE), lambda: flower.FlowerClient(0, BASE),
                 lambda: flower.client_fn(BASE)):
        with pytest.raises(ConfigError) as refused:
            make()
        message = str(refused.value)
        assert len(message.splitlines()) == 1 and message.count(". ") == 0 and len(message) < 200, message
        assert 'pip install "hasfl-ray[flower]"' in message and "flwr" in message


@pytest.mark.parametrize("fields", [{"devices": "lognormal"}, {"mode": "async", "devices": "lognormal"}])
def test_a_run_on_the_simulated_clock_is_refused_in_one_sentence(fields):
    from hasfl_ray import flower

    with pytest.raises(ConfigError) as refused:  # before Flower is needed: the run itself cannot be a strategy's
        flower.Strategy("fedavg", BASE, **fields)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and len(message) < 200 and "expected mode sync without devices" in message
    assert repr(fields.get("mode", "sync")) in message
