"""RayBackend: bit-identical to the local backend with 1 or 2 actors, through a killed trainer; 10,000 clients."""

import json
import os
import re

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from click.testing import CliRunner  # noqa: E402

from hasfl_ray.cli.main import main  # noqa: E402
from hasfl_ray.engine import Engine, RunConfig  # noqa: E402
from hasfl_ray.simulation.backend import RayBackend  # noqa: E402
from hasfl_ray.engine.records import TIMINGS  # noqa: E402

DIGITS = dict(rounds=3, clients=10, clients_per_round=5, seed=3)


def run(tmp_path, name, **kw):
    """Run DIGITS with ``kw``; returns (summary, metrics lines without wall_s, the engine)."""
    out = tmp_path / name
    engine = Engine(RunConfig(**{"backend": "local", **DIGITS, **kw}), out_dir=str(out))
    summary = engine.run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
    return summary, lines, engine


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    summary, lines, _ = run(tmp_path_factory.mktemp("local"), "local", backend="local")
    return summary["params_sha256"], lines


def test_one_actor_from_the_cli_default_equals_the_local_backend(ray_local, local_reference, tmp_path):
    out = tmp_path / "ray1"
    args = [f"--{k.replace('_', '-')}={v}" for k, v in DIGITS.items()]
    result = CliRunner().invoke(main, ["simulate", *args, "--actors", "1", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output  # no --backend: Ray, since it is installed
    config = (out / "config.yaml").read_text()
    assert "backend: ray" in config and "# actors: 1" in config
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["params_sha256"], lines) == local_reference
    assert ray.is_initialized()  # the caller's Ray is left running; the backend killed only its actors


@pytest.mark.parametrize("placement", ["driver", "actor"])
def test_two_actors_and_a_trainer_killed_mid_round_equal_the_local_backend(ray_local, local_reference, tmp_path,
                                                                           placement):
    summary, lines, engine = run(tmp_path, "ray2", backend="ray", actors=2, fault_inject="kill-trainer@1",
                                 server_placement=placement)
    assert engine.backend.replaced_actors == 1
    assert (summary["params_sha256"], lines) == local_reference
    # the server in the driver (no server actor: its process is this one) or on an actor of its own
    assert engine.backend.plan.server == placement
    assert f"# server: {placement}\n" in (tmp_path / "ray2" / "config.yaml").read_text()
    # every trainer and the server actor set the deterministic torch configuration in their own process
    places = engine.backend.places
    processes = 3 if placement == "actor" else 2
    assert len(places) == processes and len({place["pid"] for place in places} | {os.getpid()}) == processes + 1
    for place in places:
        assert place["determinism"]["deterministic"] is True and place["determinism"]["exact_float32"] is True
        assert place["determinism"]["cublas_workspace_config"] == ":4096:8"


def test_a_poisoned_update_is_rejected_on_ray_as_on_the_local_backend(ray_local, tmp_path):
    local, local_lines, _ = run(tmp_path, "local-nan", backend="local", fault_inject="nan-update@1")
    summary, lines, _ = run(tmp_path, "ray-nan", backend="ray", actors=2, fault_inject="nan-update@1")
    assert [line["rejected_updates"] for line in lines] == [0, 1, 0]
    assert (summary["params_sha256"], lines) == (local["params_sha256"], local_lines)


def test_an_evaluation_subset_is_the_same_on_ray_as_on_the_local_backend(ray_local, local_reference, tmp_path):
    local, local_lines, _ = run(tmp_path, "local-subset", backend="local", eval_samples=120)
    summary, lines, _ = run(tmp_path, "ray-subset", backend="ray", actors=2, eval_samples=120)
    assert lines == local_lines  # bit-identical metrics lines (accuracy and loss on the same 120 test images)
    assert {k: v for k, v in summary.items() if k not in TIMINGS} == {k: v for k, v in local.items() if k not in TIMINGS}
    assert summary["eval_samples"] == 120 and summary["params_sha256"] == local_reference[0]  # training untouched
    assert [line["test_accuracy"] for line in lines] != [line["test_accuracy"] for line in local_reference[1]]


def test_ten_thousand_virtual_clients(ray_local):
    config = RunConfig(dataset="synthetic", clients=10_000, clients_per_round=100, rounds=2, backend="ray",
                       actors=1)
    engine = Engine(config)
    summary = engine.run()
    assert summary["rounds"] == 2 and 0 <= summary["final_accuracy"] <= 1
    assert isinstance(engine.backend, RayBackend) and engine.backend.total_train_seconds > 0
    # Driver-side state is O(clients) numbers, never O(clients x model).
    state = engine.algorithm.state_dict()
    state_bytes = sum(np.asarray(v).nbytes for v in state.values())
    assert state_bytes <= 10_000 * 8 * len(state)
    assert [line["round"] for line in engine.history] == [0, 1]


def test_batched_training_on_two_actors_through_a_killed_trainer_equals_the_local_backend(ray_local, tmp_path):
    """--client-batching on: each trainer gets the clients of one width together (train_group); the grouping
    depends only on the round's tasks, so the result is the local backend's, bit for bit, even when a trainer
    dies with a group in flight and the group is trained again."""
    local, local_lines, _ = run(tmp_path, "local-batched", backend="local", client_batching="on")
    summary, lines, engine = run(tmp_path, "ray-batched", backend="ray", actors=2, client_batching="on",
                                 fault_inject="kill-trainer@1")
    assert engine.backend.replaced_actors == 1
    assert (summary["params_sha256"], lines) == (local["params_sha256"], local_lines)
    assert "client_batching: 'on'" in (tmp_path / "ray-batched" / "config.yaml").read_text()


def test_mixed_width_batching_on_two_actors_equals_the_local_backend(ray_local, tmp_path):
    """--client-batching mixed: the batchable clients of every width go to one trainer as one unit, trained padded
    to the widest (train_mixed); the driver plans the units from the tasks and the model alone, so two actors give
    the local backend's result bit for bit."""
    local, local_lines, _ = run(tmp_path, "local-mixed", backend="local", client_batching="mixed")
    summary, lines, engine = run(tmp_path, "ray-mixed", backend="ray", actors=2, client_batching="mixed")
    assert engine.backend.pads_exactly  # the digits CNN: every width in one unit
    assert (summary["params_sha256"], lines) == (local["params_sha256"], local_lines)
    assert "client_batching: mixed" in (tmp_path / "ray-mixed" / "config.yaml").read_text()


def test_ray_stays_in_simulation():
    """Models, algorithms, training, aggregation, ops and data never mention Ray; elsewhere outside simulation/
    only a guarded import inside a function may (e.g. a version probe), so nothing needs Ray to import."""
    package = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "hasfl_ray")
    core = ("models", "algorithms", "training", "aggregation", "ops", "data")
    any_import = re.compile(r"^\s*(import|from)\s+ray(\.|\s|$)", re.MULTILINE)
    top_level_import = re.compile(r"^(import|from)\s+ray(\.|\s|$)", re.MULTILINE)
    offenders = []
    for root, _, files in os.walk(package):
        relative = os.path.relpath(root, package)
        if relative.startswith("simulation"):
            continue
        pattern = any_import if relative.split(os.sep)[0] in core else top_level_import
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name), encoding="utf-8") as handle:
                    if pattern.search(handle.read()):
                        offenders.append(os.path.join(relative, name))
    assert offenders == []


def test_calls_are_one_per_trainer_for_a_small_round_and_balanced_by_longest_first():
    """A round of up to UNITS_PER_CALL units per trainer is one call per trainer (one returned object each); the
    units are spread longest-processing-time-first, so the calls' loads are as even as LPT makes them; a larger
    round gets more, smaller calls (at most CALLS_PER_TRAINER per trainer); batched groups stay whole and marked;
    nothing is lost or repeated."""
    from hasfl_ray.simulation.backend import CALLS_PER_TRAINER, UNITS_PER_CALL, calls

    units = [[k] for k in range(10)]
    costs = [9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0, 5.0]
    planned = calls(units, costs, trainers=2)
    assert len(planned) == 2 and sorted(k for call in planned for unit, _ in call for k in unit) == list(range(10))
    loads = [sum(costs[unit[0]] for unit, _ in call) for call in planned]
    assert loads == sorted(loads, reverse=True) and loads[0] - loads[1] <= min(costs)  # heaviest call first
    assert all(not batched for call in planned for _, batched in call)
    many = calls([[k] for k in range(1000)], [1.0] * 1000, trainers=2)
    assert len(many) == 2 * CALLS_PER_TRAINER
    assert len(calls([[k] for k in range(2 * UNITS_PER_CALL)], [1.0] * 2 * UNITS_PER_CALL, trainers=2)) == 2
    assert len(calls([[k] for k in range(4 * UNITS_PER_CALL)], [1.0] * 4 * UNITS_PER_CALL, trainers=2)) == 4
    mixed = calls([[0, 5, 7], [1], [2], [3, 4]], [3.0, 1.0, 1.0, 2.0], trainers=1)
    assert mixed == [[([0, 5, 7], True), ([1], False), ([2], False), ([3, 4], True)]]  # one call, in position order
    assert calls([], [], trainers=2) == []


def test_evaluation_cost_counts_full_width_passes_and_cheaper_narrow_ones():
    """What spreads a round's evaluations over the trainers: a full-width pass is 1, a narrower one 0.3."""
    from hasfl_ray.simulation.backend import evaluation_cost

    assert evaluation_cost("evaluate", ()) == 1.0
    assert evaluation_cost("evaluate_widths", ([0.25, 0.5, 0.75], None)) == pytest.approx(0.9)
    assert evaluation_cost("test_beats", ([0.5, 1.0], None)) == pytest.approx(1.3)
    assert evaluation_cost("evaluate_widths", ([], None)) == 0.0



def test_many_clients_a_round_several_to_a_call_through_a_killed_trainer_equal_the_local_backend(ray_local, tmp_path):
    """48 synthetic clients a round on 2 trainers: 3 clients per call; a trainer killed with calls in flight has
    them trained again; the result is the local backend's bit for bit."""
    many = dict(dataset="synthetic", clients=300, clients_per_round=48, rounds=2, seed=5)
    out_local, out_ray = tmp_path / "local-many", tmp_path / "ray-many"
    local = Engine(RunConfig(**many, backend="local"), out_dir=str(out_local)).run()
    engine = Engine(RunConfig(**many, backend="ray", actors=2, fault_inject="kill-trainer@1"), out_dir=str(out_ray))
    summary = engine.run()
    assert engine.backend.replaced_actors == 1
    assert summary["params_sha256"] == local["params_sha256"]
    strip = lambda path: [{k: v for k, v in json.loads(line).items() if k != "wall_s"}  # noqa: E731
                          for line in open(path / "metrics.jsonl", encoding="utf-8")]
    assert strip(out_ray) == strip(out_local)
