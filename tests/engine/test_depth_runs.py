"""Runs of depth sub-models (issue 44 item 1c, ``--sub-model depth|width_depth``): what a client trains and sends,
the same result on every backend and after a resume, and a depth the model lacks refused in one sentence."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.data import load_dataset
from hasfl_ray.engine.participants import initial_parameters
from hasfl_ray.models import build_model, register_model
from hasfl_ray.models.choice import with_exits
from hasfl_ray.training.task import ClientTask, ExitsObjective, OptimizerSettings
from hasfl_ray.training.trainer import Trainer

#: Every run here names its backend: the tests mind no Ray already running in this process, so the shared Ray of the
#: module before is kept into this one (tests/conftest.py).
RAY_MAY_ALREADY_RUN = True

RUN = ["simulate", "--dataset", "digits", "--rounds", "3", "--clients", "6", "--clients-per-round", "3",
       "--sub-model", "width_depth", "--checkpoint-every", "1", "--quiet"]


def sha(out):
    return json.loads((out / "summary.json").read_text())["params_sha256"]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("depth") / "run"
    result = CliRunner().invoke(main, RUN + ["--backend", "local", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_a_depth_client_trains_and_sends_only_its_stages_and_exits():
    """The digits CNN with exits: a depth-1 client at width 1/2 sends the width-1/2 slices of stage 1 and exit 1,
    nothing of stage 2 or the final head; a depth-2 client sends every parameter."""
    dataset = with_exits(load_dataset("digits", num_clients=6, alpha=0.3, seed=0))
    name = dataset.model
    assert name == "digits+exits"
    register_model(name, dataset.model_config)
    full = build_model(name)
    specs = full.param_specs()
    params = initial_parameters(name, 0)
    trainer = Trainer(dataset, name, OptimizerSettings(batch_size=16))
    shallow = trainer.train(ClientTask(0, 0, 0.5, 0.05, 0, ExitsObjective(), depth=1), params)
    assert set(shallow.update) == {n for n, d in full.param_depths().items() if d == 1}
    assert "fc1.weight" not in shallow.update and "exit1.weight" in shallow.update
    assert all(tuple(t.shape) == specs[n].sliced_shape(0.5) for n, t in shallow.update.items())
    assert all(bool(t.abs().sum() > 0) for t in shallow.update.values())  # every held tensor trained
    deep = trainer.train(ClientTask(1, 0, 1.0, 0.05, 0, ExitsObjective(), depth=2), params)
    assert set(deep.update) == set(specs)


def test_the_run_trains_the_model_with_exits(local_run):
    """Every round aggregates exit 1 (every depth holds it) beside the backbone, and the run says its sub_model."""
    lines = [json.loads(line) for line in (local_run / "metrics.jsonl").read_text().splitlines()]
    assert "sub_model: width_depth" in (local_run / "config.yaml").read_text()
    rounds = [line for line in lines if "coverage_by_layer" in line]
    assert len(rounds) == 3
    for line in rounds:
        coverage = line["coverage_by_layer"]
        assert coverage["exit1.weight"] > 0 and coverage["features.0.weight"] >= coverage["features.4.weight"]


def test_ray_gives_the_local_result_bit_for_bit(ray_local, tmp_path, local_run):
    out = tmp_path / "ray"
    result = CliRunner().invoke(main, RUN + ["--backend", "ray", "--actors", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sha(out) == sha(local_run)
    assert depth_accuracies(out) == depth_accuracies(local_run)


def depth_accuracies(out):
    return [line.get("accuracy_at_depth") for line in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


def test_every_exit_is_evaluated(local_run):
    """accuracy_at_depth: the global model's depth-d sub-model (exit d) for every depth, the deepest being the full
    model's test_accuracy; summary.json keeps the last and the best."""
    lines = [json.loads(line) for line in (local_run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [line for line in lines if line.get("accuracy_at_depth")]
    assert evaluated and all(set(line["accuracy_at_depth"]) == {"1", "2"} for line in evaluated)
    assert all(line["accuracy_at_depth"]["2"] == line["test_accuracy"] for line in evaluated)
    assert all(0 <= line["accuracy_at_depth"]["1"] <= 1 for line in evaluated)
    summary = json.loads((local_run / "summary.json").read_text())
    assert summary["accuracy_at_depth_final"] == evaluated[-1]["accuracy_at_depth"]


def test_a_resumed_depth_run_gives_the_uninterrupted_result(tmp_path, local_run):
    out = tmp_path / "run"
    crashed = CliRunner().invoke(main, RUN + ["--backend", "local", "--fault-inject", "trainer-error@2",
                                              "--out", str(out)])
    assert crashed.exit_code == 1 and "injected trainer failure" in crashed.output, crashed.output
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert sha(out) == sha(local_run)
    assert depth_accuracies(out) == depth_accuracies(local_run)


def test_a_depth_the_model_lacks_is_one_sentence_and_exit_2(tmp_path):
    out = tmp_path / "bad"
    result = CliRunner().invoke(main, RUN + ["--backend", "local", "--depths", "1,2,3,3", "--out", str(out)])
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert "depths is [1, 2, 3, 3] but model 'digits+exits' has 2 depths (one a stage); expected each from 1 to 2" \
        in text and "Traceback" not in text, text
    assert not (out / "summary.json").exists() and not (out / "metrics.jsonl").exists()


def test_an_algorithm_may_hand_out_depths_and_a_bad_one_is_one_sentence():
    """``Algorithm.sub_model`` is the policy's hook: its (width, depth) is checked against the run's depth plan."""
    from hasfl_ray.engine.guard import GuardedAlgorithm
    from hasfl_ray.engine.participants import sub_models
    from hasfl_ray.models.depth_plan import DepthPlan

    class Policy:
        depth_plan = DepthPlan((0.5, 1.0), (1, 2), 2, False)

        def __init__(self, answer):
            self.answer = answer

        def sub_model(self, round, client, width):
            return self.answer(width)

    chosen = sub_models(GuardedAlgorithm(Policy(lambda w: (w, 2 if w > 0.3 else 1)), "policy"), 0, {0: 0.25, 1: 0.5})
    assert chosen == {0: (0.25, 1), 1: (0.5, 2)}
    import numpy as np  # a depth computed with numpy is a depth; a bool is not one

    chosen = sub_models(GuardedAlgorithm(Policy(lambda w: (w, np.int64(2))), "policy"), 0, {0: 0.5})
    assert chosen == {0: (0.5, 2)} and type(chosen[0][1]) is int
    chosen = sub_models(GuardedAlgorithm(Policy(lambda w: (np.float32(w), 1)), "policy"), 0, {0: 0.5})
    assert chosen == {0: (0.5, 1)} and type(chosen[0][0]) is float
    from hasfl_ray.errors import PluginInputError

    for answer in (lambda w: (w, 3), lambda w: (w, None), lambda w: (0.0, 1), lambda w: w, lambda w: (w, True),
                   lambda w: (True, 1)):
        with pytest.raises(PluginInputError, match=r"^algorithm 'policy' returned .* from sub_model\(\); expected"):
            sub_models(GuardedAlgorithm(Policy(answer), "policy"), 0, {0: 0.5})


def test_a_depth_a_plugin_hands_out_that_the_model_lacks_is_exit_2(tmp_path):
    """Issue 44: a depth the model lacks is bad input, one sentence and exit status 2, from a plug-in as from
    --depths."""
    (tmp_path / "deep.py").write_text("from hasfl_ray import Algorithm\n\n\nclass Deep(Algorithm):\n"
                                      "    def sub_model(self, round, client, width):\n        return width, 99\n")
    out = tmp_path / "run"
    result = CliRunner().invoke(main, RUN + ["--backend", "local", "--algorithm", f"{tmp_path / 'deep.py'}:Deep",
                                             "--out", str(out)])
    text = result.output.strip()
    assert result.exit_code == 2, text
    assert text.startswith("Error: algorithm 'Deep' returned (") and ", 99) from sub_model(); expected" in text, text
    assert "Traceback" not in text and text.count("\n") == 0 and not (out / "summary.json").exists(), text


def test_the_clock_charges_a_depth_client_for_what_it_holds(tmp_path):
    """A clocked run where every client trains depth 1 at full width: each round moves, each way, 4 bytes a
    parameter of the depth-1 sub-model per participant (its stage and exit), not the whole model's."""
    from hasfl_ray.clock.cost import WidthCosts

    out = tmp_path / "clocked"
    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--rounds", "2", "--clients", "6",
                                       "--clients-per-round", "3", "--sub-model", "depth", "--depths", "1,1,1,1",
                                       "--devices", "lognormal", "--backend", "local", "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    costs = WidthCosts("digits+exits")
    expected = 3 * 4 * costs.params(1.0, 1)
    assert costs.params(1.0, 1) < costs.params(1.0) / 10
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(line["bytes_down"], line["bytes_up"]) for line in lines] == [(expected, expected)] * 2


def test_an_objectives_nested_widths_are_of_the_clients_depth():
    """FjORD-like objectives run narrower widths through ``model_at``: a depth client's are of its own depth, so no
    stage it does not hold (and whose parameters it never received) takes part in its loss."""
    dataset = with_exits(load_dataset("digits", num_clients=6, alpha=0.3, seed=0))
    register_model(dataset.model, dataset.model_config)
    seen = []

    class Spy(ExitsObjective):
        def setup(self, model, initial, width, generator, model_at=None):
            seen.append((model.depth, model_at(0.25).depth, set(initial)))

    params = initial_parameters(dataset.model, 0)
    trainer = Trainer(dataset, dataset.model, OptimizerSettings(batch_size=16))
    trainer.train(ClientTask(0, 0, 0.5, 0.05, 0, Spy(), depth=1), params)
    full = build_model(dataset.model)
    assert seen == [(1, 1, set(n for n, d in full.param_depths().items() if d == 1))]
